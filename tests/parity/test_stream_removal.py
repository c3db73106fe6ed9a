"""Removing one edit from the middle of a stream of INSERTs on Gemma 3 270M (METHOD NEURON, each
edit saved as its own patch, the patch of the third then removed).

What is exact: the model is bit for bit the one the other four recorded edits make on a fresh base
(REMOVE PATCH replays the rest). What is not: a session that never made the third solves the later
edits' values with one neuron fewer at the layer, so their down vectors differ by float32 rounding
(~1e-6) and the logits on those subjects' prompts by ~1e-3; the gates and ups are the same bits, and
every other prompt's logits too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from larql.edit.insert import insert_facts
from larql.edit.methods.facts import Fact
from larql.edit.state.view import EditableVindex, edit_vindex

# the first five edits of benchmarks/data/fictional_1000.json: subjects the model has never seen
FACTS = [Fact(s, f"The capital of {s} is", t, "capital") for s, t in
         [("Zebrador", "Canberra"), ("Meigraestan", "Lisbon"), ("Kaeveistan", "Lisbon"), ("Loshenia", "Lima"),
          ("Rosia", "Copenhagen")]]
REMOVED = 2
PROBES = [f.prompt for f in FACTS] + ["Kaeveistan's capital city is", "The sun rises in the", "Berlin is a city in"]


def _logits(v: EditableVindex) -> list[np.ndarray]:
    m = v.model()
    return [m.forward(m.tokenize(p)) for p in PROBES]


@pytest.fixture(scope="module")
def stream(gemma_vindex: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[EditableVindex, Path]:
    """Five INSERTs one after another, each recorded into its own patch, then the third's removed."""
    folder = tmp_path_factory.mktemp("stream")
    v = edit_vindex(gemma_vindex)
    for i, fact in enumerate(FACTS):
        v.patches.begin(folder / f"e{i}.vlp")
        insert_facts(v, [fact], "neuron", measure=False)
        v.patches.save()
    v.patches.remove(f"e{REMOVED}.vlp")
    return v, folder


def test_removing_a_middle_edit_is_the_replay_of_the_others(stream, gemma_vindex: Path) -> None:
    v, folder = stream
    fresh = edit_vindex(gemma_vindex)
    for i in range(len(FACTS)):
        if i != REMOVED:
            fresh.patches.apply(folder / f"e{i}.vlp")
    assert all(np.array_equal(a, b) for a, b in zip(_logits(v), _logits(fresh)))
    m = v.model()
    removed = FACTS[REMOVED]
    assert removed.target not in m.generate(removed.prompt, max_new_tokens=6).text  # its fact is gone
    unedited = edit_vindex(gemma_vindex).model()
    assert m.generate(removed.prompt, max_new_tokens=6).text == unedited.generate(removed.prompt, max_new_tokens=6).text


def test_removing_a_middle_edit_answers_as_a_session_without_it(stream, gemma_vindex: Path) -> None:
    v, _ = stream
    without = edit_vindex(gemma_vindex)
    for i, fact in enumerate(FACTS):
        if i != REMOVED:
            insert_facts(without, [fact], "neuron", measure=False)
    ours = [op for p in v.patches.applied for op in p.ops]
    theirs = without.patches.pending
    assert [(op.op, op.layer) for op in ours] == [(op.op, op.layer) for op in theirs]
    for a, b in zip(ours, theirs):
        assert np.array_equal(a.vectors["gate"], b.vectors["gate"]) and np.array_equal(a.vectors["up"], b.vectors["up"])
        assert np.allclose(a.vectors["down"], b.vectors["down"], rtol=0, atol=1e-5)
    for prompt, a, b in zip(PROBES, _logits(v), _logits(without)):
        assert np.array_equal(a.argmax(-1), b.argmax(-1)), prompt
        assert float(np.abs(a - b).max()) < 0.05, prompt
    m, w = v.model(), without.model()
    for fact in FACTS:
        assert m.generate(fact.prompt, max_new_tokens=6).text == w.generate(fact.prompt, max_new_tokens=6).text
