"""The walk FFN through the vindex: dense equals the model, overrides substitute, top-k sparsifies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import larql
from larql.edit.patches.overlay import FeatureOverride
from larql.edit.state.walk_ffn import walk_model
from tests.conftest import rel_err
from tests.synthetic import TinySpec, tiny_vindex

IDS = [5, 80, 81, 120, 7, 7, 9]


@pytest.fixture(scope="module")
def vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("walk"), TinySpec("gemma3", n_layers=3, ffn=96), seed=9)


def test_dense_walk_equals_the_model(vx: Path) -> None:
    assert rel_err(walk_model(str(vx)).forward(IDS), larql.load(vx).forward(IDS)) <= 1e-5


def test_override_down_to_zero_equals_zeroing_the_feature(vx: Path) -> None:
    silenced = walk_model(str(vx), overrides={(1, 7): FeatureOverride(down=np.zeros(64, np.float32))})
    expected = larql.load(vx).forward(IDS, hooks={"blocks.1.mlp.hook_post": lambda x, n: _zero_col(x, 7)})
    assert rel_err(silenced.forward(IDS), expected) <= 1e-5
    new_gate = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    changed = walk_model(str(vx), overrides={(0, 3): FeatureOverride(gate=new_gate)}).forward(IDS)
    assert not np.allclose(changed, larql.load(vx).forward(IDS))


def _zero_col(x: np.ndarray, f: int) -> np.ndarray:
    x = x.copy()
    x[:, f] = 0
    return x


def test_top_k_walk_keeps_k_features(vx: Path) -> None:
    m = walk_model(str(vx), top_k=5)
    _, cache = m.run_with_cache(IDS, names=["blocks.2.mlp.hook_post"])
    assert np.all((cache["blocks.2.mlp.hook_post"] != 0).sum(axis=1) <= 5)
    assert rel_err(walk_model(str(vx), top_k=96).forward(IDS), larql.load(vx).forward(IDS)) <= 1e-5


def test_vindex_model_is_the_walk_and_sees_its_overlay(vx: Path) -> None:
    from larql.edit.state.view import edit_vindex

    v = edit_vindex(vx)
    m = v.model()
    before = m.forward(IDS)
    assert np.array_equal(before, larql.load(vx.parent / "m.gguf").forward(IDS))  # dense walk = the GGUF, bitwise
    v.overlay.set(1, 7, FeatureOverride(down=np.zeros(64, np.float32)))
    expected = larql.load(vx).forward(IDS, hooks={"blocks.1.mlp.hook_post": lambda x, n: _zero_col(x, 7)})
    assert rel_err(m.forward(IDS), expected) <= 1e-5  # the edit shows up without reloading
    assert np.array_equal(m.dense().forward(IDS), before)  # dense() ignores the overlay
    v.overlay.remove(1, 7)
    assert np.array_equal(m.forward(IDS), before)


def test_overlay_rejects_bad_overrides(vx: Path) -> None:
    from larql.edit.state.view import edit_vindex
    from larql.errors import VindexError

    overlay = edit_vindex(vx).overlay
    with pytest.raises(VindexError, match=r"down has shape \(63,\), expected \(64,\)"):
        overlay.set(0, 1, FeatureOverride(down=np.zeros(63, np.float32)))
    with pytest.raises(VindexError, match="layer 3 is out of range"):
        overlay.set(3, 1, FeatureOverride(gate=np.zeros(64, np.float32)))
    with pytest.raises(VindexError, match="feature 65632 is out of range"):
        overlay.set(0, 96 + 65536, FeatureOverride(gate=np.zeros(64, np.float32)))
    with pytest.raises(VindexError, match="F96 is past the layer's 96 features: adding it needs"):
        overlay.set(0, 96, FeatureOverride(gate=np.zeros(64, np.float32)))  # an added feature comes whole
    with pytest.raises(VindexError, match="NaN"):
        overlay.set(0, 1, FeatureOverride(up=np.full(64, np.nan, np.float32)))
    assert len(overlay) == 0


def test_unrelated_prompts_are_reused_until_an_edit(vx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The edit report's unrelated distributions are kept per model revision: the same values while
    nothing changes, computed again after an edit (and after its undo), and never kept for a model
    that cannot name its revision."""
    from larql.edit.measure import evaluate as ev
    from larql.edit.state.view import edit_vindex
    from larql.model.generate import log_softmax

    v = edit_vindex(vx)
    m = v.model()
    calls: list[int] = []
    real = type(m).next_logits_batch

    def counted(self: larql.Model, *args: object, **kw: object) -> np.ndarray:
        calls.append(1)
        return real(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(type(m), "next_logits_batch", counted)
    first = ev.unrelated_logps(m)
    again = ev.unrelated_logps(m)
    assert len(calls) == 1 and all(np.array_equal(a, b) for a, b in zip(first, again))
    v.overlay.set(1, 7, FeatureOverride(down=np.full(64, 3.0, np.float32)))
    edited = ev.unrelated_logps(m)
    assert len(calls) == 2 and not all(np.array_equal(a, b) for a, b in zip(first, edited))
    alone = [log_softmax(real(m, [m.tokenize(p)])[0], np.float64) for p in ev.UNRELATED[:3]]
    assert all(np.abs(a - b).max() <= 1e-4 for a, b in zip(edited, alone))
    v.overlay.remove(1, 7)
    back = ev.unrelated_logps(m)
    assert len(calls) == 3 and all(np.abs(a - b).max() <= 1e-5 for a, b in zip(first, back))
    monkeypatch.setattr(m, "revision", lambda: None)  # a model that cannot say what it computes
    ev.unrelated_logps(m)
    ev.unrelated_logps(m)
    assert len(calls) == 5


def test_the_overlay_keeps_its_own_copy_of_an_edit(vx: Path) -> None:
    """A vector given to the overlay is copied: the caller writing into it afterwards changes
    neither the model nor what the caches keyed on the overlay's revision hold."""
    from larql.edit.state.view import edit_vindex

    v = edit_vindex(vx)
    m = v.model()
    down = np.full(64, 2.0, np.float32)
    v.overlay.set(1, 7, FeatureOverride(down=down))
    u, w, keys = np.ones((64, 1), np.float32), np.ones((96, 1), np.float32), np.ones((96, 1), np.float32)
    v.overlay.add_weight(2, u, w, keys)
    before = m.forward(IDS)
    down[:] = -50.0
    u[:] = 9.0
    assert np.array_equal(m.forward(IDS), before)
