"""down_meta's top-k tokens per feature (larql/vindex/topk.py): the bounded int8 pass (its AVX-512
VNNI kernel and its AVX2 one, 7-bit feature codes) and the float32 one must each give the exact top-k: the ids and float32
values of a float64 brute force (scores rounded to float32, ranked by value descending then id
ascending). A tier runs when this CPU and numba's target have it (LARQL_ISA caps it: CI runs the
file once per tier)."""

from __future__ import annotations

import numpy as np
import pytest

from larql.quant import isa
from larql.vindex import topk, topk_kernels

PATHS = [pytest.param(t, marks=pytest.mark.skipif(not isa.runs(t), reason=f"tier {isa.TIER}: no {t}"))
         for t in isa.TIERS]


def reference(u: np.ndarray, wt: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    s = (wt.astype(np.float64) @ u.astype(np.float64).T).astype(np.float32)
    ids = np.zeros((len(wt), k), np.int64)
    vals = np.full((len(wt), k), -np.inf, np.float32)
    for f, row in enumerate(s):
        order = np.lexsort((np.arange(len(row)), -row))[:k]
        ids[f, :len(order)], vals[f, :len(order)] = order, row[order]
    return ids, vals


def check(u: np.ndarray, wt: np.ndarray, k: int, tier: str) -> None:
    ids, vals = topk.top_tokens(topk.prepare(u, tier=tier), wt, k)
    rid, rval = reference(u, wt, k)
    assert ids.dtype == np.uint32 and vals.dtype == np.float32
    bad = np.flatnonzero((ids != rid).any(axis=1) | (vals != rval).any(axis=1))
    assert len(bad) == 0, f"features {bad[:5]}: {ids[bad[:1]]} {vals[bad[:1]]} != {rid[bad[:1]]} {rval[bad[:1]]}"


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Vocabulary chunks of 256 rows, so a few-thousand-token vocabulary spans several (and ends
    in a partial one)."""
    monkeypatch.setattr(topk, "VOCAB_CHUNK", 256)


@pytest.mark.parametrize("tier", PATHS)
@pytest.mark.parametrize("hidden", [64, 70, 7])
def test_random(tier: str, hidden: int, small_chunks: None) -> None:
    rng = np.random.default_rng(hidden)
    u = rng.standard_normal((3001, hidden)).astype(np.float32)  # not a multiple of 32 or of the chunk
    wt = rng.standard_normal((13, hidden)).astype(np.float32)  # not a multiple of the micro-tile's 4
    check(u, wt, 10, tier)


@pytest.mark.parametrize("tier", PATHS)
def test_ties_keep_lower_ids(tier: str, small_chunks: None) -> None:
    """Exact ties (small integers: every score exact): copies of the best rows scattered over the
    vocabulary, and a zero feature (every score 0: ids 0..k-1)."""
    rng = np.random.default_rng(1)
    u = rng.integers(-3, 4, (2000, 40)).astype(np.float32)
    wt = rng.integers(-3, 4, (9, 40)).astype(np.float32)
    wt[4] = 0
    for f in range(4):
        best = int(np.argmax(u @ wt[f]))
        u[rng.choice(2000, 7, replace=False)] = u[best]
    check(u, wt, 5, tier)


@pytest.mark.parametrize("tier", PATHS)
@pytest.mark.parametrize(("copies", "eps"), [(30, 1e-5), (900, 1e-3), (900, 1e-5)])
def test_near_ties_within_int8_rounding(tier: str, copies: int, eps: float, small_chunks: None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens whose scores differ by far less than the int8 bound: all become candidates. 900 of
    them outgrow the candidate buffer (and the wider one, made 64 here): the feature goes to the
    float32 pass (1e-3 apart: it sorts them out) and then (1e-5: within its bound too) is scored
    exactly over the whole vocabulary."""
    monkeypatch.setattr(topk, "WIDE", 64)
    rng = np.random.default_rng(copies)
    u = rng.standard_normal((3000, 96)).astype(np.float32)
    wt = rng.standard_normal((6, 96)).astype(np.float32)
    best = int(np.argmax(u @ wt[0]))
    where = rng.choice(3000, copies, replace=False)
    u[where] = u[best] + eps * rng.standard_normal((copies, 96)).astype(np.float32)
    check(u, wt, 10, tier)


@pytest.mark.parametrize("tier", PATHS)
def test_scales(tier: str, small_chunks: None) -> None:
    """Rows and features from 1e-18 to 1e15 (scores down to float32's subnormals), zero rows."""
    rng = np.random.default_rng(2)
    u = rng.standard_normal((1500, 50)).astype(np.float32)
    u *= (10.0 ** rng.integers(-18, 15, 1500)).astype(np.float32)[:, None]
    u[::97] = 0
    wt = rng.standard_normal((10, 50)).astype(np.float32)
    wt *= (10.0 ** np.array([-20, -10, -1, 0, 0, 1, 5, 10, 12, 0])).astype(np.float32)[:, None]
    check(u, wt, 10, tier)


@pytest.mark.parametrize("tier", PATHS)
def test_compaction(tier: str, monkeypatch: pytest.MonkeyPatch, small_chunks: None) -> None:
    """Candidate buffers of 16 slots, then 20: compaction and every later pass run on ordinary data."""
    monkeypatch.setattr(topk_kernels, "CAP", 16)
    monkeypatch.setattr(topk, "WIDE", 20)
    rng = np.random.default_rng(3)
    u = rng.standard_normal((4000, 33)).astype(np.float32)
    wt = rng.standard_normal((17, 33)).astype(np.float32)
    check(u, wt, 8, tier)


@pytest.mark.parametrize("tier", PATHS)
def test_vocab_smaller_than_k(tier: str) -> None:
    rng = np.random.default_rng(4)
    u = rng.standard_normal((5, 32)).astype(np.float32)
    wt = rng.standard_normal((3, 32)).astype(np.float32)
    ids, vals = topk.top_tokens(topk.prepare(u, tier=tier), wt, 8)
    rid, rval = reference(u, wt, 8)
    assert (ids[:, :5] == rid[:, :5]).all() and (vals == rval).all() and (ids[:, 5:] == 0).all()


@pytest.mark.parametrize("tier", PATHS)
def test_full_scale_codes(tier: str, small_chunks: None) -> None:
    """Every code +-127 on both sides (rows of +-1): the largest int16 pair sums the AVX2 kernel
    forms (2 x 127 x 127), which an unsigned u + 128 operand would have saturated; the scores,
    whole numbers, tie often."""
    rng = np.random.default_rng(5)
    u = rng.choice(np.array([-1.0, 1.0], np.float32), (2500, 96))
    wt = rng.choice(np.array([-1.0, 1.0], np.float32), (9, 96))
    wt[3] = np.where(u[17] > 0, 1.0, -1.0).astype(np.float32)  # u[17] . w = 96, far above the rest
    check(u, wt, 6, tier)


def assert_bound_holds(tok: topk.Tokens, wt: np.ndarray, k: int, rid: np.ndarray, rval: np.ndarray) -> None:
    """After the tier's approximate pass (no rescoring yet), for every feature it did not mark
    `over`: its floor is at most the true k-th score, and every true top-k token is a candidate
    whose upper bound reaches that floor, so rescoring can find it."""
    run = topk._f32_pass if tok.packed is None else topk._int8_pass
    lotop, cand_t, cand_hi, cand_n, over = run(tok, wt, k, topk_kernels.CAP)
    for f in np.flatnonzero(~over[:len(wt)]):
        floor = lotop[f, k - 1]
        assert floor <= rval[f, -1], (f, floor, rval[f, -1])
        kept = set(cand_t[f, :cand_n[f]][cand_hi[f, :cand_n[f]] >= floor].tolist())
        missing = set(rid[f][np.isfinite(rval[f])].tolist()) - kept
        assert not missing, f"feature {f}: true top-{k} tokens {sorted(missing)} ruled out"


@pytest.mark.parametrize("tier", PATHS)
@pytest.mark.parametrize("hidden", [64, 70, 640])
def test_bound_keeps_every_true_top_token(tier: str, hidden: int) -> None:
    """The pass itself, before rescoring: each tier's floors and candidates (the AVX2 pass's 7-bit
    feature codes give a wider bound than the VNNI one's, never a wrong one)."""
    rng = np.random.default_rng(hidden)
    u = rng.standard_normal((5000, hidden)).astype(np.float32)
    u[::7] *= 1e-3
    u[rng.random(u.shape) < 0.01] = 0
    wt = rng.standard_normal((22, hidden)).astype(np.float32)
    assert_bound_holds(topk.prepare(u, tier=tier), wt, 10, *reference(u, wt, 10))


def test_not_finite_takes_the_plain_pass() -> None:
    """inf in the unembedding: no bound holds; the float32 scan ranks what it computes."""
    u = np.eye(4, 8, dtype=np.float32)
    u[2, 0] = np.inf
    ids, vals = topk.top_tokens(topk.prepare(u), np.eye(2, 8, dtype=np.float32), 2)
    assert ids[0, 0] == 2 and vals[0, 0] == np.inf and ids[1, 0] == 1 and vals[1, 0] == 1.0
