"""The one FFN block with edits as a strategy: no edits is the dense block bit for bit; overrides,
deletions, top-k and a low-rank down delta each match a dense numpy reference."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import larql
from larql.model.ffn import FFN, FeatureVectors, gated
from larql.model.forward import rms_norm
from tests.conftest import rel_err
from tests.synthetic import write_gguf

IDS = [5, 71, 72, 3, 200, 9, 9, 44]


@dataclass
class Edits:
    """A hand-filled FFNEdits."""

    overrides: dict[int, dict[int, FeatureVectors]] = field(default_factory=dict)
    gone: dict[int, set[int]] = field(default_factory=dict)
    deltas: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    more: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    top_k: int | None = None

    def feature_overrides(self, layer: int) -> dict[int, FeatureVectors]:
        return self.overrides.get(layer, {})

    def deleted(self, layer: int) -> set[int]:
        return self.gone.get(layer, set())

    def down_delta(self, layer: int) -> tuple[np.ndarray, np.ndarray] | None:
        return self.deltas.get(layer)

    def added(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        return self.more.get(layer)


@pytest.fixture
def m(tiny: dict) -> larql.Model:
    return larql.load(tiny["root"] / "f32.gguf")  # F32: the dequantized matrices are the weights


def _h(m: larql.Model, layer: int = 1) -> np.ndarray:
    _, cache = m.run_with_cache(IDS, names=[f"blocks.{layer}.hook_resid_mid"])
    lw = m.weights.layers[layer]
    return rms_norm(cache[f"blocks.{layer}.hook_resid_mid"], lw.ffn_norm, m.config.norm_eps)  # (T, hidden)


def _dense(m: larql.Model, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lw = m.weights.layers[layer]
    return lw.gate.dequantize(), lw.up.dequantize(), lw.down.dequantize()  # (ffn, h), (ffn, h), (h, ffn)


def test_no_edits_is_the_dense_block_bit_for_bit(m: larql.Model) -> None:
    h, lw = _h(m), m.weights.layers[1]
    dense = lw.down.matmul(gated(m.config.activation, lw.gate.matmul(h), lw.up.matmul(h)))
    assert np.array_equal(FFN(m.config, m.weights)(1, h, None, 0), dense)
    assert np.array_equal(FFN(m.config, m.weights, Edits())(1, h, None, 0), dense)  # an empty strategy too
    assert np.array_equal(m.with_edits(Edits()).forward(IDS), m.forward(IDS))
    assert m.dense() is m and m.with_edits(Edits()).dense().edits is None


def test_feature_overrides_match_edited_matrices(m: larql.Model) -> None:
    rng = np.random.default_rng(1)
    hidden = m.config.hidden
    g, u, d = (rng.standard_normal(hidden).astype(np.float32) for _ in range(3))
    edits = Edits(overrides={1: {3: (g, None, None), 7: (None, u, d), 9: (g, u, d)}})
    wg, wu, wd = _dense(m, 1)
    wg[3], wu[7], wd[:, 7], wg[9], wu[9], wd[:, 9] = g, u, d, g, u, d
    h = _h(m)
    expected = gated(m.config.activation, h @ wg.T, h @ wu.T) @ wd.T
    assert rel_err(FFN(m.config, m.weights, edits)(1, h, None, 0), expected) <= 1e-5


def test_added_features_are_the_block_made_wider(m: larql.Model) -> None:
    """Features appended to a layer compute what the FFN with those rows and columns appended does,
    beside overrides and deletions of base features; the hook points keep the base width."""
    rng = np.random.default_rng(4)
    hidden, n = m.config.hidden, 5
    g_add, u_add = (rng.standard_normal((n, hidden)).astype(np.float32) for _ in range(2))
    d_add = rng.standard_normal((hidden, n)).astype(np.float32)
    g = rng.standard_normal(hidden).astype(np.float32)
    edits = Edits(overrides={1: {3: (g, None, None)}}, gone={1: {6}}, more={1: (g_add, u_add, d_add)})
    wg, wu, wd = _dense(m, 1)
    wg[3], wd[:, 6] = g, 0.0
    wg, wu, wd = np.vstack([wg, g_add]), np.vstack([wu, u_add]), np.hstack([wd, d_add])  # (ffn + n, hidden) ...
    h = _h(m)
    expected = gated(m.config.activation, h @ wg.T, h @ wu.T) @ wd.T
    got = FFN(m.config, m.weights, edits)(1, h, None, 0)
    assert rel_err(got, expected) <= 1e-5 and rel_err(got, FFN(m.config, m.weights)(1, h, None, 0)) > 1e-2
    widths = []
    m.with_edits(edits).forward(IDS, hooks={"blocks.1.mlp.hook_post": lambda x, name: widths.append(x.shape[1]) or x})
    assert widths == [m.config.ffn]


def test_deleted_features_write_nothing(m: larql.Model) -> None:
    edits = Edits(gone={0: {2, 5}})

    def zero(x: np.ndarray, name: str) -> np.ndarray:
        x = x.copy()
        x[:, [2, 5]] = 0
        return x

    expected = m.forward(IDS, hooks={"blocks.0.mlp.hook_post": zero})
    assert np.array_equal(m.with_edits(edits).forward(IDS), expected)


def test_top_k_keeps_the_largest_gate_scores(m: larql.Model) -> None:
    h = _h(m)
    wg, wu, wd = _dense(m, 1)
    gate = h @ wg.T
    act = gated(m.config.activation, gate, h @ wu.T)
    keep = np.argsort(-np.abs(gate), axis=1)[:, :4]
    mask = np.zeros_like(act)
    np.put_along_axis(mask, keep, 1.0, axis=1)
    got = FFN(m.config, m.weights, Edits(top_k=4))(1, h, None, 0)
    assert rel_err(got, (act * mask) @ wd.T) <= 1e-5
    everything = FFN(m.config, m.weights, Edits(top_k=m.config.ffn))(1, h, None, 0)
    assert np.array_equal(everything, FFN(m.config, m.weights)(1, h, None, 0))


def test_low_rank_down_delta_equals_the_dense_update(m: larql.Model, tiny: dict, tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    hidden, ffn, r = m.config.hidden, m.config.ffn, 3
    U = (0.3 * rng.standard_normal((hidden, r))).astype(np.float32)
    V = (0.3 * rng.standard_normal((ffn, r))).astype(np.float32)
    edits = Edits(deltas={1: (U, V)})
    h = _h(m)
    wg, wu, wd = _dense(m, 1)
    expected = gated(m.config.activation, h @ wg.T, h @ wu.T) @ (wd + U @ V.T).T
    assert rel_err(FFN(m.config, m.weights, edits)(1, h, None, 0), expected) <= 1e-5
    # the whole model: the delta applied live equals a model whose W_down was rewritten densely
    weights = dict(tiny["weights"])
    name = "model.layers.1.mlp.down_proj.weight"
    weights[name] = (weights[name] + U @ V.T).astype(np.float32)
    write_gguf(tmp_path / "delta.gguf", tiny["spec"], weights)
    rewritten = larql.load(tmp_path / "delta.gguf")
    live = m.with_edits(edits).forward(IDS)
    assert rel_err(live, rewritten.forward(IDS)) <= 1e-5
    assert rel_err(live, m.forward(IDS)) > 1e-3  # the delta matters


def test_hooks_fire_once_through_the_edited_block(m: larql.Model) -> None:
    seen: list[str] = []
    names = ["blocks.1.mlp.hook_pre", "blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out"]
    hooks = {n: (lambda x, name: seen.append(name)) for n in names}
    d = np.zeros(m.config.hidden, np.float32)
    m.with_edits(Edits(overrides={1: {0: (None, None, d)}}, top_k=5)).forward(IDS, hooks=hooks)
    assert seen == names


def test_float32_copies_are_held_once_each_and_refused_past_their_budget(tiny: dict) -> None:
    """float32_copies gives each matrix's dense() once (a tied lm_head is the embedding), equal to
    its dequantization; while the list lives the matrices keep them, and past its byte budget it
    gives nothing (a large model's INSERT does not double its weights in float32)."""
    from larql.model.weights import float32_copies, named_tensors
    from larql.quant import QuantMatrix

    q8 = larql.load(tiny["root"] / "q8.gguf")
    w = q8.weights  # the layers' matrices and the lm_head; an untied embedding is read by rows, never held
    matrices = {id(x): x for name, x in named_tensors(w) if isinstance(x, QuantMatrix) and name.startswith("blk.")}
    matrices[id(w.output)] = w.output
    size = sum(x.n_rows * x.n_cols * 4 for x in matrices.values())
    assert float32_copies(q8.weights, max_bytes=size - 1) == []
    assert all(x._dense[0]() is None for x in matrices.values() if x._dense)
    held = float32_copies(q8.weights, max_bytes=size)
    assert len(held) == len(matrices) and sum(a.nbytes for a in held) == size
    by_id = {id(a): a for a in held}
    for x in matrices.values():
        assert id(x.dense()) in by_id and np.array_equal(x.dense(), x.dequantize())
    del held, by_id
    assert all(x._dense[0]() is None for x in matrices.values())
