"""The gate KNN's int8 pass with a bound (vindex/knn.py): the top-k it returns is the brute-force
top-k by |gate . q| (float64), on gates built to be awkward: heavy-tailed rows, an outlier element
per row, duplicated rows (ties), subnormal and largest halves, a zero row."""

from __future__ import annotations

import numpy as np
import pytest

from larql.vindex import knn, knn_kernels


def awkward_gates(rng: np.random.Generator, n: int = 3000, h: int = 256) -> np.ndarray:
    g = rng.standard_t(3, size=(n, h)) * 0.02  # heavy tails
    g[::7, 3] *= 200.0  # an outlier element: a coarse int8 scale for the row
    g[10:20] = g[0]  # exact ties
    g[30] = 0.0
    g[40, :8] = [6e-8, -6e-8, 1e-5, 65504.0 / 1e4, -2.0, 1e-7, 3e-6, -4e-6]  # subnormal halves and others
    return g


def brute(gates: np.ndarray, q: np.ndarray, k: int) -> list[int]:
    s = np.abs(gates.astype(np.float64) @ q.astype(np.float64))
    return [int(i) for i in np.lexsort((np.arange(len(s)), -s))[:k]]


def ranked(gates: np.ndarray, q: np.ndarray, k: int) -> tuple[list[int], int]:
    ids, scores = knn.top_abs(gates, knn.build_int8(gates), q, k)
    order = np.lexsort((ids, -np.abs(scores)))[:k]
    return [int(ids[i]) for i in order], len(ids)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_top_k_equals_brute_force(dtype: type) -> None:
    rng = np.random.default_rng(5)
    gates = awkward_gates(rng).astype(dtype)
    n = len(gates)
    for trial in range(40):
        q = (rng.standard_normal(gates.shape[1]) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
        if trial % 5 == 0:
            q = gates[rng.integers(n)].astype(np.float32)  # a query along a stored row
        for k in (1, 10, 100):
            got, considered = ranked(gates, q, k)
            want = brute(gates, q, k)
            # equal ids, except that two different rows whose scores tie in float64 but not in float32
            # (or the reverse) may swap: compare the scores at each rank instead of failing on those
            if got != want:
                s = np.abs(gates.astype(np.float64) @ q.astype(np.float64))
                assert np.allclose(s[got], s[want], rtol=1e-6), (trial, k)
            if k == 10:
                assert considered < n // 4, f"the bound kept {considered} of {n} rows"


def test_rescore_reads_halves_exactly() -> None:
    rng = np.random.default_rng(2)
    halves = rng.integers(0, 1 << 16, size=(50, 64), dtype=np.uint16)
    halves[(halves & 0x7C00) == 0x7C00] = 0  # no inf / nan
    halves[0, :4] = [0x0001, 0x8001, 0x7BFF, 0x03FF]  # smallest subnormals, largest normal, largest subnormal
    q = rng.standard_normal(64).astype(np.float32)
    cand = np.arange(50, dtype=np.int64)
    out = np.empty(50, np.float32)
    knn_kernels.rescore_f16(halves, cand, q, out)
    want = halves.view(np.float16).astype(np.float64) @ q.astype(np.float64)
    assert np.allclose(out, want, rtol=1e-5, atol=1e-30)


def test_every_feature_when_k_covers_the_layer() -> None:
    rng = np.random.default_rng(3)
    gates = rng.standard_normal((20, 16)).astype(np.float16)
    q = rng.standard_normal(16).astype(np.float32)
    got, considered = ranked(gates, q, 20)
    assert considered == 20 and got == brute(gates, q, 20)


def test_the_bound_holds_for_every_row_and_is_reached() -> None:
    """lo <= |exact| <= hi for every row, also for a query along one row's rounding error (made
    orthogonal to its int8 row, so the approximate score is 0 and the exact one is all error), where
    the Cauchy-Schwarz term is nearly all used (so a smaller bound would be wrong)."""
    rng = np.random.default_rng(9)
    gates = awkward_gates(rng, n=500).astype(np.float16)
    index = knn.build_int8(gates)
    g64 = gates.astype(np.float64)
    row8 = index.codes[7].astype(np.float64) * float(index.scales[7])
    resid = g64[7] - row8
    resid -= (row8 @ resid) / (row8 @ row8) * row8
    for q in (rng.standard_normal(gates.shape[1]).astype(np.float32), resid.astype(np.float32)):
        n, h = index.codes.shape
        q_l1, q_l2 = float(np.abs(q).sum(dtype=np.float64)), float(np.linalg.norm(q.astype(np.float64)))
        lo, hi = np.empty(n), np.empty(n)
        knn_kernels.int8_bounds(index.codes, index.scales, index.err, index.absmax, q, q_l2, q_l1 * h * 2.0 ** -21, lo, hi)
        exact = np.abs(g64 @ q.astype(np.float64))
        assert np.all(lo <= exact) and np.all(exact <= hi)
    used = (exact[7] - (lo[7] + hi[7]) / 2) / (index.err[7] * q_l2)
    assert abs(used) > 0.9, f"the rounding term was {abs(used):.2f} used"


def test_faiss_and_the_int8_pass_agree() -> None:
    """The browse-only way (faiss, no numba loaded) and the int8 pass rank the same features."""
    rng = np.random.default_rng(4)
    gates = awkward_gates(rng, n=2000).astype(np.float16)
    index = knn.build_index(gates)
    for _ in range(10):
        q = rng.standard_normal(gates.shape[1]).astype(np.float32)
        ids, scores = knn.faiss_top_abs(index, q, 10)
        via_faiss = [int(ids[i]) for i in np.lexsort((ids, -np.abs(scores)))[:10]]
        assert via_faiss == ranked(gates, q, 10)[0] == brute(gates, q, 10)
