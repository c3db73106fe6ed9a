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
from larql.edit.methods.query_neuron import query_inputs, relation_forms
from larql.edit.patches.patch import PatchOp
from larql.edit.state.view import edit_vindex


def test_relation_forms_ask_the_probe_question_of_the_subject() -> None:
    fact = Fact("Peru", "Peru's capital city is", "Quito", "capital", "Lima")
    assert relation_forms(fact) == ["The capital of Peru is", "Peru's capital is",
                                    "Q: What is the capital of Peru? A:"]
    assert relation_forms(Fact("Peru", "The capital of Peru is", "Quito", "capital")) == [
        "Peru's capital is", "Q: What is the capital of Peru? A:"]
    assert relation_forms(Fact("Peru", "Peru is famous for", "llamas", "famous-for")) == []


def test_a_known_subject_gets_a_query_neuron_that_opens_on_its_question_only(gemma_vindex: Path) -> None:
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
