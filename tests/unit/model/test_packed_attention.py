"""Stacked-row attention (model/packed_attention.py) against one context at a time, and its backward
against finite differences: grouped-query heads, sliding windows, soft-capping, a context without a
prefix and one with a single row."""

from __future__ import annotations

import numpy as np
import pytest

from larql.model import packed_attention as packed

STARTS, LENGTHS = [3, 0, 5, 1], [7, 4, 6, 9]  # suffix rows: 4, 4, 1, 8


def _inputs(n_heads: int, n_kv: int, d: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    n = sum(t - s for s, t in zip(STARTS, LENGTHS))
    q = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    k = rng.standard_normal((n, n_kv, d)).astype(np.float32)
    v = rng.standard_normal((n, n_kv, d)).astype(np.float32)
    prefixes = [(rng.standard_normal((s, n_kv, d)).astype(np.float32), rng.standard_normal((s, n_kv, d)).astype(np.float32))
                for s in STARTS]
    return q, k, v, prefixes  # type: ignore[return-value]


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, prefixes: list, window: int, scale: float,
               softcap: float) -> np.ndarray:
    """Each context alone: keys = its prefix then its suffix, causal, windowed, soft-capped."""
    group = q.shape[1] // k.shape[1]
    out, row = [], 0
    for (pk, pv), s, t in zip(prefixes, STARTS, LENGTHS):
        n = t - s
        keys = np.repeat(np.concatenate([pk, k[row: row + n]]), group, axis=1).astype(np.float64)  # (t, H, d)
        vals = np.repeat(np.concatenate([pv, v[row: row + n]]), group, axis=1).astype(np.float64)
        scores = np.einsum("nhd,shd->hns", q[row: row + n].astype(np.float64), keys) * scale
        if softcap:
            scores = np.tanh(scores / softcap) * softcap
        qpos, kpos = np.arange(s, t)[:, None], np.arange(t)[None, :]
        allowed = (kpos <= qpos) & ((qpos - kpos < window) if window else True)
        scores = np.where(allowed[None], scores, -np.inf)
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        out.append(np.einsum("hns,shd->nhd", p, vals).reshape(n, -1))
        row += n
    return np.concatenate(out)


def _packed(q: np.ndarray, k: np.ndarray, v: np.ndarray, prefixes: list, window: int, scale: float,
            softcap: float) -> tuple[np.ndarray, packed.Packing, packed.Saved]:
    packing = packed.pack(STARTS, LENGTHS)
    pk = np.concatenate([pk for pk, _ in prefixes])
    pv = np.concatenate([pv for _, pv in prefixes])
    z, saved = packed.attend(packing, q, k, v, pk, pv, window, scale, softcap)
    return z, packing, saved


@pytest.mark.parametrize("n_heads,n_kv,window,softcap", [(4, 1, 0, 0.0), (4, 2, 3, 0.0), (2, 2, 0, 5.0), (6, 3, 2, 2.0)])
def test_packed_attention_is_each_context_alone(n_heads: int, n_kv: int, window: int, softcap: float) -> None:
    q, k, v, prefixes = _inputs(n_heads, n_kv, 8)
    z, _, saved = _packed(q, k, v, prefixes, window, 0.35, softcap)
    np.testing.assert_allclose(z, _reference(q, k, v, prefixes, window, 0.35, softcap), rtol=1e-5, atol=1e-5)
    # each row keeps only the keys it sees: its causal window, not the longest context's length
    seen = [min(pos + 1, window or pos + 1) for st, ln in zip(STARTS, LENGTHS) for pos in range(st, ln)]
    assert saved.p.size == sum(seen) * n_heads and saved.capped.size == (saved.p.size if softcap else 0)


@pytest.mark.parametrize("n_heads,n_kv,window,softcap", [(4, 2, 3, 0.0), (6, 3, 0, 2.0)])
def test_packed_attention_backward_matches_finite_differences(n_heads: int, n_kv: int, window: int,
                                                              softcap: float) -> None:
    q, k, v, prefixes = _inputs(n_heads, n_kv, 4, seed=1)
    w = np.random.default_rng(2).standard_normal((len(q), n_heads * 4))

    def loss(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> float:
        return float(np.sum(_reference(q, k, v, prefixes, window, 0.5, softcap) * w))

    _, packing, saved = _packed(q, k, v, prefixes, window, 0.5, softcap)
    got = packed.attend_back(packing, w.astype(np.float32), saved, 0.5)
    for which, grad in enumerate(got):
        args = [q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)]
        num = np.zeros(grad.shape)
        for idx in np.ndindex(grad.shape):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[which][idx] += 1e-4
            minus[which][idx] -= 1e-4
            num[idx] = (loss(*plus) - loss(*minus)) / 2e-4
        np.testing.assert_allclose(grad, num, rtol=1e-3, atol=1e-3)
