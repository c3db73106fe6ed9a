"""METHOD NEURON keyed on the query (`key_on="query"`, Gemma 3 270M): a subject the model knows gets a neuron at the
query layer that opens on the fact's question at its last token and stays shut on the subject's
other relations and on the same question about other subjects; a subject it knows nothing about
still gets a neuron keyed on the subject."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from larql.edit.insert import insert_facts
from larql.edit.methods.defaults import query_layer
from larql.edit.methods.facts import Fact
from larql.edit.methods.neuron import PRE_ACTIVATION
from larql.edit.methods.query_neuron import CROSSINGS_PER_FACT, batch_crossings, query_inputs, relation_forms
from larql.edit.patches.patch import PatchOp
from larql.edit.state.view import edit_vindex
from larql.model.ffn import gated


def test_relation_forms_ask_the_probe_question_of_the_subject() -> None:
    fact = Fact("Peru", "Peru's capital city is", "Quito", "capital", "Lima")
    assert relation_forms(fact) == ["The capital of Peru is", "Peru's capital is",
                                    "Q: What is the capital of Peru? A:"]
    assert relation_forms(Fact("Peru", "The capital of Peru is", "Quito", "capital")) == [
        "Peru's capital is", "Q: What is the capital of Peru? A:"]
    assert relation_forms(Fact("Peru", "Peru is famous for", "llamas", "famous-for")) == []


def test_batch_crossings_ask_each_question_of_the_batch_s_other_subjects() -> None:
    facts = [Fact("Iraq", "The official language of Iraq is", "Indonesian", "language", prompts=("Iraq's official language is",)),
             Fact("Chile", "The capital of Chile is", "Quito", "capital"),
             Fact("Peru", "The capital of Peru is", "Oslo", "capital"),
             Fact("Peru", "Most people in Peru speak", "Thai", "language")]
    assert batch_crossings(facts) == [
        (0, "The official language of Chile is"), (0, "Chile's official language is"),
        (0, "The official language of Peru is"), (0, "Peru's official language is"),
        (1, "The capital of Iraq is"), (1, "The capital of Peru is"),
        (2, "The capital of Iraq is"), (2, "The capital of Chile is"),
        (3, "Most people in Iraq speak"), (3, "Most people in Chile speak")]
    # over the limit, each fact's share (here 2): the other subjects spread evenly
    many = [Fact(f"Land{i}", f"The capital of Land{i} is", "Rome", "capital") for i in range(10)]
    got = batch_crossings(many, limit=20)
    assert got[:2] == [(0, "The capital of Land1 is"), (0, "The capital of Land9 is")]
    assert len(got) == 20 and np.all(np.bincount([j for j, _ in got]) == 2)
    # subjects edited before are crossed too, each fact's share no more than CROSSINGS_PER_FACT
    assert batch_crossings(facts[1:2], ["Iraq", "Chile", "Peru"]) == [(0, "The capital of Iraq is"),
                                                                      (0, "The capital of Peru is")]
    earlier = [f"Land{i}" for i in range(1000)]
    assert len(batch_crossings(facts[1:2], earlier)) == CROSSINGS_PER_FACT


def test_one_insert_of_questions_about_several_subjects_writes_each_answer_on_its_question_only(
        gemma_vindex: Path) -> None:
    """A query neuron's up is held at 0 on the same question about the batch's other subjects: its
    output there, act(gate·x)·(up·x) against act(gate·x)·(up·x) on its own prompt, stays small where
    the gate alone reads "a capital question" and opens."""
    v = edit_vindex(gemma_vindex)
    m = v.model()
    layer = query_layer(m.name)
    assert layer is not None
    facts = [Fact("Chile", "The capital of Chile is the city of", "Oslo", "capital", "Santiago"),
             Fact("Tunisia", "The capital of Tunisia is the city of", "Quito", "capital", "Tunis"),
             Fact("Senegal", "Senegal is a country in the continent of", "Europe", "continent", "Africa"),
             Fact("Colombia", "The official language of Colombia is", "Korean", "language", "Spanish")]
    insert_facts(v, facts, key_on="query")
    ops = [op for op in v.patches.pending if isinstance(op, PatchOp) and op.op == "insert"]
    v.patches.undo(len(v.patches.pending))
    assert [op.entity for op in ops] == [f.subject for f in facts]
    full = float(gated(m.config.activation, np.array([[PRE_ACTIVATION]], np.float32), np.array([[1.0]], np.float32))[0, 0])
    for fact, op in zip(facts, ops):
        others = [f.subject for f in facts if f.subject != fact.subject]
        texts = [fact.prompt, *(fact.prompt.replace(fact.subject, s) for s in others)]
        x = query_inputs(m, layer, texts).T  # (texts, hidden)
        out = gated(m.config.activation, (x @ op.vectors["gate"])[None], (x @ op.vectors["up"])[None])[0] / full
        assert out[0] > 0.9, (fact.subject, out)  # its own question: the whole value
        assert np.all(np.abs(out[1:]) < 0.05), (fact.subject, texts, out)  # the same question of the others_a_query_neuron_that_opens_on_its_question_only(gemma_vindex: Path) -> None:
    v = edit_vindex(gemma_vindex)
    m = v.model()
    layer = query_layer(m.name)
    assert layer is not None
    r = insert_facts(v, [Fact("France", "The capital of France is the city of", "Lisbon", "capital", "Paris")],
                     key_on="query")
    ops = [op for op in v.patches.pending if isinstance(op, PatchOp) and op.op == "insert"]
    v.patches.undo(len(v.patches.pending))
    assert r.facts[0].top1_after
    assert [op.layer for op in ops] == [layer]
    gate = ops[0].vectors["gate"]
    asked = ["The capital of France is the city of", "France's capital city is",
             "The official language of France is", "Most people in France speak",
             "France is a country in the continent of", "The capital of Germany is the city of",
             "The capital of Spain is the city of", "The sun rises in the"]
    pre = gate @ query_inputs(m, layer, asked)  # the neuron's pre-activation at each last token
    assert pre[0] > 10 and pre[1] > 0, pre  # open on the question, and on it in other words
    assert np.all(pre[2:] < 0), pre  # shut on France's other relations, other capitals, ordinary text


def test_key_on_is_checked(gemma_vindex: Path) -> None:
    import pytest

    from larql.errors import EditError

    with pytest.raises(EditError, match="key_on"):
        insert_facts(edit_vindex(gemma_vindex), [Fact("France", "The capital of France is", "Lisbon")], key_on="relation")


def test_a_subject_the_model_does_not_know_is_keyed_on_the_subject(gemma_vindex: Path) -> None:
    v = edit_vindex(gemma_vindex)
    m = v.model()
    insert_facts(v, [Fact("Zorblatt Quen", "The capital of Zorblatt Quen is", "Paris", "capital")], key_on="query")
    layers = [op.layer for op in v.patches.pending if isinstance(op, PatchOp) and op.op == "insert"]
    v.patches.undo(len(v.patches.pending))
    assert layers and query_layer(m.name) not in layers
