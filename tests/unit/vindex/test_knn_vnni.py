"""The gate KNN's int8 x int16 pass (AVX-512 VNNI's vpdpwssd, AVX2's vpmaddwd; knn.approx_bounds): the
top-k is brute force's on random and adversarial gates and queries, the bound holds for every row and
is reached, the int32 dots are exact at the largest codes, the two tiers' bounds are the same bits,
and the float32 tier's int8 x float32 pass returns the same features."""

from __future__ import annotations

import numpy as np
import pytest

from larql.quant import isa
from larql.vindex import knn, knn_kernels
from tests.unit.vindex.test_knn_bound import awkward_gates, brute

INT16_TIERS = [t for t in ("avx512vnni", "avx2") if isa.runs(t)]
needs_int16 = pytest.mark.skipif(not INT16_TIERS, reason="the float32 tier: only the int8 x float32 pass runs")


def ranked(gates: np.ndarray, index: knn.Int8Gates, q: np.ndarray, k: int, tier: str) -> tuple[list[int], int]:
    ids, scores = knn.top_abs(gates, index, q, k, tier)
    order = np.lexsort((ids, -np.abs(scores)))[:k]
    return [int(ids[i]) for i in order], len(ids)


def adversarial_gates(rng: np.random.Generator, n: int, h: int, dtype: type) -> np.ndarray:
    """awkward_gates plus near-ties (a row and copies off by one f16 ulp here and there), rows of
    zeros, rows with a single nonzero, and (float32) rows scaled from 1e-6 to 1e6."""
    g = awkward_gates(rng, n, h)
    g[50:60] = g[1]
    g[50:60, rng.integers(0, h, 10)] += 2e-5  # near-ties
    g[60:70] = 0.0
    g[70, 5] = 1.0
    g[71, h - 1] = -0.5  # the last column: in the padded block when h % 32 != 0
    if dtype == np.float32:
        g[100:400] *= 10.0 ** rng.uniform(-6, 6, size=(300, 1))
    return g.astype(dtype)


def queries(rng: np.random.Generator, gates: np.ndarray) -> list[np.ndarray]:
    h = gates.shape[1]
    out = []
    for trial in range(24):
        q = rng.standard_normal(h) * 10.0 ** rng.uniform(-4, 4)
        if trial % 4 == 1:
            q[rng.integers(0, h, 3)] *= 300.0  # outlier dimensions, as in real residuals
        if trial % 4 == 2:
            q = gates[rng.integers(len(gates))].astype(np.float64) * 10.0  # along a stored row
        if trial % 4 == 3:
            q = np.round(q * 4) / 4  # ties among query values
        out.append(q.astype(np.float32))
    return out + [np.zeros(h, np.float32), np.full(h, 1e-30, np.float32), np.full(h, 1e20, np.float32)]


def same_scores(gates: np.ndarray, q: np.ndarray, got: list[int], want: list[int]) -> bool:
    """Equal ids, or (rows whose scores tie in float64 but not float32, or the reverse) equal scores."""
    if got == want:
        return True
    s = np.abs(gates.astype(np.float64) @ q.astype(np.float64))
    return bool(np.allclose(s[got], s[want], rtol=1e-6, atol=1e-300))


@needs_int16
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("h", [256, 100])  # 100: rows and query padded to 128 columns
def test_top_k_equals_brute_force_both_passes(dtype: type, h: int) -> None:
    rng = np.random.default_rng(h)
    gates = adversarial_gates(rng, 2000, h, dtype)
    index = knn.build_int8(gates)
    assert index.codes.shape == (2000, -(-h // 32) * 32) and not index.codes[:, h:].any()
    for i, q in enumerate(queries(rng, gates)):
        for k in (1, 10, 100):
            want = brute(gates, q, k)
            for tier in INT16_TIERS:
                new, considered_new = ranked(gates, index, q, k, tier)
                assert same_scores(gates, q, new, want), (tier, i, k)
            old, _ = ranked(gates, index, q, k, "float32")
            assert same_scores(gates, q, old, want), (i, k)
            if k == 10 and np.any(q) and i < 24:  # not for the zero query (every row ties at 0)
                assert considered_new < len(gates) // 4, f"query {i}: the bound kept {considered_new} rows"


def bounds(index: knn.Int8Gates, q: np.ndarray, tier: str) -> tuple[np.ndarray, np.ndarray]:
    return knn.approx_bounds(index, q, tier)


@pytest.mark.parametrize("tier", [*INT16_TIERS, "float32"])
def test_the_bound_holds_for_every_row_and_is_reached(tier: str) -> None:
    """lo <= |exact| <= hi for every row; for a query along one row's rounding error (orthogonal to
    its int8 row, so nearly all of the exact score is error) a bound 0.8x as wide fails."""
    rng = np.random.default_rng(9)
    gates = adversarial_gates(rng, 500, 200, np.float16)
    index = knn.build_int8(gates)
    g64 = gates.astype(np.float64)
    row8 = index.codes[7, :200].astype(np.float64) * float(index.scales[7])
    resid = g64[7] - row8
    resid -= (row8 @ resid) / (row8 @ row8) * row8
    for q in [*queries(rng, gates)[:8], resid.astype(np.float32)]:
        lo, hi = bounds(index, q, tier)
        exact = np.abs(g64 @ q.astype(np.float64))
        assert np.all(lo <= exact) and np.all(exact <= hi)
    mid, half = (lo + hi) / 2, (hi - lo) / 2
    assert not (mid[7] - 0.8 * half[7] <= exact[7] <= mid[7] + 0.8 * half[7]), "a 0.8x bound still held"


@needs_int16
def test_query_digits_and_the_int32_dots_are_exact() -> None:
    """quantize_query's ||q - q^|| and ||q^|| are those of the codes it wrote; rows of +-127 codes
    against a query of +-127 first digits (each lane near 4 * 127 * 32639, the most the kernel sums
    in int32 before float32) give the integer dots (to the float32 sum's rounding), for h = 8192."""
    rng = np.random.default_rng(1)
    q = (rng.standard_normal(320) * np.repeat(10.0 ** rng.uniform(-3, 3, 10), 32)).astype(np.float32)
    q16, dq = np.empty(320, np.int16), np.empty(10, np.float32)
    err, hat = knn_kernels.quantize_query(q, q16, dq)
    qhat = q16.astype(np.float64).reshape(10, 32) * dq[:, None].astype(np.float64)
    assert err == pytest.approx(np.linalg.norm(qhat.ravel() - q), rel=1e-12)
    assert hat == pytest.approx(np.linalg.norm(qhat), rel=1e-12)
    assert err < 1e-4 * np.linalg.norm(q)  # one int8 digit: ~3e-3 of the norm; the second takes ~256x off
    q1 = np.round(q16 / 256.0)
    assert np.abs(q1).max() <= 127 and np.abs(q16 - 256 * q1).max() <= 127  # two int8 digits
    h = 8192
    signs = np.where(rng.random(h) < 0.5, -1.0, 1.0)
    gates = np.stack([np.ones(h), -np.ones(h), signs]).astype(np.float32)
    index = knn.build_int8(gates)
    assert np.array_equal(np.abs(index.codes), np.full((3, h), 127))
    nb = h // 32
    for q in (np.ones(h, np.float32), signs.astype(np.float32), np.zeros(h, np.float32)):
        q16, dq = np.empty(h, np.int16), np.empty(nb, np.float32)
        knn_kernels.quantize_query(q, q16, dq)
        assert np.all(np.abs(q16) // 256 == 127 * np.abs(q))  # first digit +-127: lanes near 4 * 127 * 32639
        qhat = q16.astype(np.float64).reshape(nb, 32) * dq[:, None].astype(np.float64)
        want = np.abs(index.codes.astype(np.float64) * index.scales[:, None].astype(np.float64) @ qhat.ravel())
        lo, hi = bounds(index, q, INT16_TIERS[0])
        # the int32 dots are exact; only the float32 sum of nb scaled dots rounds
        assert np.allclose((lo + hi) / 2, want, rtol=1.01 * (nb + 16) * 2.0 ** -24, atol=0)
        assert np.all(lo <= np.abs(gates.astype(np.float64) @ q)) and np.all(np.abs(gates.astype(np.float64) @ q) <= hi)


@pytest.mark.skipif(len(INT16_TIERS) < 2, reason="needs a CPU with AVX-512 VNNI to run both int16 forms")
def test_the_avx2_pass_gives_the_vnni_passs_bounds_bit_for_bit() -> None:
    rng = np.random.default_rng(4)
    for h in (256, 100, 640):
        gates = adversarial_gates(rng, 1500, h, np.float16)
        index = knn.build_int8(gates)
        for q in queries(rng, gates):
            v_lo, v_hi = bounds(index, q, "avx512vnni")
            a_lo, a_hi = bounds(index, q, "avx2")
            assert np.array_equal(v_lo, a_lo) and np.array_equal(v_hi, a_hi)


def test_the_float32_tier_runs_the_int8_x_float32_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the float32 tier (or LARQL_ISA=float32) top_abs runs the int8 x float32 pass: the same features."""
    rng = np.random.default_rng(6)
    gates = adversarial_gates(rng, 1000, 96, np.float16)
    index = knn.build_int8(gates)
    monkeypatch.setattr(knn_kernels, "TIER", "float32")
    for q in queries(rng, gates)[:8]:
        lo, hi = knn.approx_bounds(index, q)
        old_lo, old_hi = knn.approx_bounds(index, q, "float32")
        assert np.array_equal(lo, old_lo) and np.array_equal(hi, old_hi)
        ids, scores = knn.top_abs(gates, index, q, 10)
        got = [int(ids[i]) for i in np.lexsort((ids, -np.abs(scores)))[:10]]
        assert same_scores(gates, q, got, brute(gates, q, 10))
