"""An editing session that ends gives back what it took: once its view is dropped, nothing module-level
keeps its model, its overlay or its float32 weights (tests/parity/test_session_memory.py measures the
memory on Gemma); a live session keeps what its next INSERT reuses, and the key statistics of a
model's weights are shared by every model over those weights."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest

from larql.edit.insert import insert_facts
from larql.edit.methods.facts import Fact
from larql.edit.methods.metrics import _metrics, key_metrics, stats_dir
from larql.edit.methods.weight_edit import dense_layers
from larql.edit.state.view import edit_vindex
from tests.synthetic import TinySpec, tiny_vindex

PROMPT = "Colour of zeta"
SESSIONS = 3


@pytest.fixture(scope="module")
def vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("sessions"), TinySpec("gemma3", n_layers=4, ffn=96), seed=5, dtype="f16")


def _edit_and_drop(vx: Path, method: str) -> list[weakref.ref[Any]]:
    """Open a session, INSERT one fact, and return weak references to what it held: the view, its model,
    the model's weights and a float32 copy of one of them."""
    v = edit_vindex(vx)
    insert_facts(v, [Fact("zeta", PROMPT, "blue", "colour")], method)
    m = v.model()
    copy = m.weights.layers[-1].gate.dense()  # Q8_0: a copy, the one the view's float32 weights hold
    assert any(a is copy for a in v.float32_weights())
    return [weakref.ref(x) for x in (v, m, m.weights, copy)]


@pytest.mark.parametrize("method", ["neuron", "rome"])
def test_a_dropped_editing_session_leaves_nothing_behind(vx: Path, method: str) -> None:
    before = set(_metrics)
    held = [ref for _ in range(SESSIONS) for ref in _edit_and_drop(vx, method)]
    gc.collect()  # the leak was a live reference (a module cache's value holding its key), not a cycle
    alive = [ref() for ref in held if ref() is not None]
    assert not alive, [type(x).__name__ for x in alive]
    assert set(_metrics) <= before  # the sessions' statistics went with their weights


def test_a_live_session_keeps_what_its_next_insert_reuses(vx: Path) -> None:
    v = edit_vindex(vx)
    insert_facts(v, [Fact("zeta", PROMPT, "blue", "colour")], "neuron", measure=False)
    m = v.model()
    kept, dense = v.float32_weights(), dense_layers(m)
    layer = v.patches.pending[-1].layer
    metric = key_metrics(m, [layer], stats_dir(v), point="input")[layer]
    insert_facts(v, [Fact("omega", "Colour of omega", "red", "colour")], "neuron", layers=[layer], measure=False)
    assert v.float32_weights() is kept and dense_layers(m) is dense
    assert key_metrics(m, [layer], stats_dir(v), point="input")[layer] is metric


def test_models_over_the_same_weights_share_their_statistics(vx: Path) -> None:
    v = edit_vindex(vx)
    m = v.model()
    got = key_metrics(m, [1], stats_dir(v), point="input")[1]
    assert key_metrics(m.dense(), [1], stats_dir(v), point="input")[1] is got  # another model, the same weights
    other = edit_vindex(vx).model()  # weights of its own: from the statistics file, not from memory
    assert key_metrics(other, [1], stats_dir(v), point="input")[1] is not got
