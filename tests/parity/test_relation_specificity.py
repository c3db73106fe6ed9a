"""An edit of one relation leaves the subject's other relations alone (Gemma 3 270M, METHOD NEURON,
INSERT's default there): a new capital for France does not move the language its people speak or the
continent it lies in, asked in words no edit or hold uses, and INSERT's report lists those relations
before and after."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from larql.edit.insert import insert_facts
from larql.edit.methods.facts import Fact
from larql.edit.state.view import edit_vindex
from larql.model.model import Model

OTHER = ("Most people in France speak", "France is a country located in the continent of")


def _top1(m: Model, prompts: tuple[str, ...]) -> list[str]:
    logits = m.next_logits_batch([m.tokenize(p) for p in prompts])
    return [m.detokenize([int(np.argmax(row))]).strip() for row in logits]


def test_a_new_capital_keeps_the_subjects_language_and_continent(gemma_vindex: Path) -> None:
    v = edit_vindex(gemma_vindex)
    m = v.model()
    before = _top1(m, OTHER)
    assert before == ["French", "Europe"]
    r = insert_facts(v, [Fact("France", "The capital of France is the city of", "Lisbon", "capital", "Paris")])
    assert r.facts[0].top1_after  # the edit took
    after = _top1(m, OTHER)
    checked = {c.relation: c for c in r.relations}
    v.patches.undo(len(v.patches.pending))
    assert after == before
    # the report reads, before and after, the relations DESCRIBE's probes know (here France's language)
    assert "capital" not in checked and checked["language"].before == "French"
    assert all(c.kept for c in r.relations), r.relations
