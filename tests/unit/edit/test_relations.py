"""The pieces of relation specificity on a tiny model: the prompt asked in other words, the holds an
edit keeps (never the relation it edits), and RelS scored against the model's own answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from larql.edit.measure.evaluate import EditRecord, load_edit_set, score_records, summarise
from larql.edit.methods.facts import Fact, rewrites
from larql.edit.methods.relations import relation_holds
from larql.edit.state.view import edit_vindex
from larql.model.model import Model
from larql.model.targets import target_ids
from tests.synthetic import TinySpec, tiny_vindex


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Model:
    vx = tiny_vindex(tmp_path_factory.mktemp("relations"), TinySpec("gemma3", n_layers=2, ffn=64), seed=3)
    return edit_vindex(vx).model()


def test_rewrites_ask_the_same_relation_subject_first_and_as_a_question() -> None:
    assert rewrites("The capital of Japan is", "Japan") == ["Japan's capital is", "Q: What is the capital of Japan? A:"]
    assert rewrites("The capital of Libya is the city of", "Libya") == [
        "Libya's capital is the city of", "Q: What is the capital of Libya? A: The city of"]
    assert rewrites("The currency of Japan is the", "Japan")[0] == "Japan's currency is the"
    assert rewrites("Japan is a country in the continent of", "Japan") == []  # already subject first
    assert rewrites("The capital of Japan is", "Tokyo") == []  # not the fact's subject


def test_holds_never_ask_the_edited_relation(model: Model) -> None:
    facts = [Fact("zeta", "The capital of zeta is", "blue", "capital")]
    holds = relation_holds(model, facts)["zeta"]
    assert holds and not any(h.startswith("The capital of") or "capital" in h for h in holds)
    assert "The official language of zeta is" in holds or not any("language" in h for h in holds)
    for h in holds:
        assert "zeta" in h


def test_rels_is_the_share_of_other_relations_keeping_the_models_answer(model: Model, tmp_path: Path) -> None:
    # the tiny byte-level tokenizer reads every target " x" as the space byte first: a prompt keeps a
    # target's first token as its top-1 exactly where the model's next byte is the space
    space = target_ids(model, "x")[0]
    texts = [f"zeta {a}{end}" for a in "abcdefgh" for end in ("k", " ")]
    logits = model.next_logits_batch([model.tokenize(p) for p in texts])
    tops = [int(np.argmax(row)) for row in logits]
    kept = next(t for t, top in zip(texts, tops) if top == space)
    moved = next(t for t, top in zip(texts, tops) if top != space)
    doc = {"format": "larql-edit-set", "version": 1, "edits": [
        {"subject": "zeta", "prompt": "Colour of zeta", "target_new": "blue",
         "other_relations": [{"prompt": kept, "target": "x"}, {"prompt": moved, "target": "x"},
                             {"prompt": kept, "target": "y"}]}]}
    path = tmp_path / "set.json"
    path.write_text(json.dumps(doc))
    (rec,) = load_edit_set(path)
    assert rec.other_relations == ((kept, "x"), (moved, "x"), (kept, "y"))
    assert summarise(score_records(model, [rec], ()))["RelS"] == pytest.approx(200 / 3)
    none = EditRecord(rec.subject, rec.prompt, rec.target_new, other_relations=((moved, "x"),))
    assert summarise(score_records(model, [none], ()))["RelS"] == 0.0
