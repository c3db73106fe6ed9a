"""down_meta's top-k tokens per feature (larql/vindex/topk.py): the bounded int8 pass (AVX-512 VNNI)
and the float32 one must both give the exact top-k: the ids and float32 values of a float64
brute force (scores rounded to float32, ranked by value descending then id ascending)."""

from __future__ import annotations

import numpy as np
import pytest

from larql.quant.argmax import HAVE_VNNI
from larql.vindex import topk, topk_kernels

PATHS = [pytest.param(True, marks=pytest.mark.skipif(not HAVE_VNNI, reason="no AVX-512 VNNI")), False]


def reference(u: np.ndarray, wt: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    s = (wt.astype(np.float64) @ u.astype(np.float64).T).astype(np.float32)
    ids = np.zeros((len(wt), k), np.int64)
    vals = np.full((len(wt), k), -np.inf, np.float32)
    for f, row in enumerate(s):
        order = np.lexsort((np.arange(len(row)), -row))[:k]
        ids[f, :len(order)], vals[f, :len(order)] = order, row[order]
    return ids, vals


def check(u: np.ndarray, wt: np.ndarray, k: int, vnni: bool) -> None:
    ids, vals = topk.top_tokens(topk.prepare(u, vnni=vnni), wt, k)
    rid, rval = reference(u, wt, k)
    assert ids.dtype == np.uint32 and vals.dtype == np.float32
    bad = np.flatnonzero((ids != rid).any(axis=1) | (vals != rval).any(axis=1))
    assert len(bad) == 0, f"features {bad[:5]}: {ids[bad[:1]]} {vals[bad[:1]]} != {rid[bad[:1]]} {rval[bad[:1]]}"


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Vocabulary chunks of 256 rows, so a few-thousand-token vocabulary spans several (and ends
    in a partial one)."""
    monkeypatch.setattr(topk, "VOCAB_CHUNK", 256)


@pytest.mark.parametrize("vnni", PATHS)
@pytest.mark.parametrize("hidden", [64, 70, 7])
def test_random(vnni: bool, hidden: int, small_chunks: None) -> None:
    rng = np.random.default_rng(hidden)
    u = rng.standard_normal((3001, hidden)).astype(np.float32)  # not a multiple of 32 or of the chunk
    wt = rng.standard_normal((13, hidden)).astype(np.float32)  # not a multiple of the micro-tile's 4
    check(u, wt, 10, vnni)


@pytest.mark.parametrize("vnni", PATHS)
def test_ties_keep_lower_ids(vnni: bool, small_chunks: None) -> None:
    """Exact ties (small integers: every score exact): copies of the best rows scattered over the
    vocabulary, and a zero feature (every score 0: ids 0..k-1)."""
    rng = np.random.default_rng(1)
    u = rng.integers(-3, 4, (2000, 40)).astype(np.float32)
    wt = rng.integers(-3, 4, (9, 40)).astype(np.float32)
    wt[4] = 0
    for f in range(4):
        best = int(np.argmax(u @ wt[f]))
        u[rng.choice(2000, 7, replace=False)] = u[best]
    check(u, wt, 5, vnni)


@pytest.mark.parametrize("vnni", PATHS)
@pytest.mark.parametrize(("copies", "eps"), [(30, 1e-5), (900, 1e-3), (900, 1e-5)])
def test_near_ties_within_int8_rounding(vnni: bool, copies: int, eps: float, small_chunks: None,
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
    check(u, wt, 10, vnni)


@pytest.mark.parametrize("vnni", PATHS)
def test_scales(vnni: bool, small_chunks: None) -> None:
    """Rows and features from 1e-18 to 1e15 (scores down to float32's subnormals), zero rows."""
    rng = np.random.default_rng(2)
    u = rng.standard_normal((1500, 50)).astype(np.float32)
    u *= (10.0 ** rng.integers(-18, 15, 1500)).astype(np.float32)[:, None]
    u[::97] = 0
    wt = rng.standard_normal((10, 50)).astype(np.float32)
    wt *= (10.0 ** np.array([-20, -10, -1, 0, 0, 1, 5, 10, 12, 0])).astype(np.float32)[:, None]
    check(u, wt, 10, vnni)


@pytest.mark.parametrize("vnni", PATHS)
def test_compaction(vnni: bool, monkeypatch: pytest.MonkeyPatch, small_chunks: None) -> None:
    """Candidate buffers of 16 slots, then 20: compaction and every later pass run on ordinary data."""
    monkeypatch.setattr(topk_kernels, "CAP", 16)
    monkeypatch.setattr(topk, "WIDE", 20)
    rng = np.random.default_rng(3)
    u = rng.standard_normal((4000, 33)).astype(np.float32)
    wt = rng.standard_normal((17, 33)).astype(np.float32)
    check(u, wt, 8, vnni)


@pytest.mark.parametrize("vnni", PATHS)
def test_vocab_smaller_than_k(vnni: bool) -> None:
    rng = np.random.default_rng(4)
    u = rng.standard_normal((5, 32)).astype(np.float32)
    wt = rng.standard_normal((3, 32)).astype(np.float32)
    ids, vals = topk.top_tokens(topk.prepare(u, vnni=vnni), wt, 8)
    rid, rval = reference(u, wt, 8)
    assert (ids[:, :5] == rid[:, :5]).all() and (vals == rval).all() and (ids[:, 5:] == 0).all()


def test_not_finite_takes_the_plain_pass() -> None:
    """inf in the unembedding: no bound holds; the float32 scan ranks what it computes."""
    u = np.eye(4, 8, dtype=np.float32)
    u[2, 0] = np.inf
    ids, vals = topk.top_tokens(topk.prepare(u), np.eye(2, 8, dtype=np.float32), 2)
    assert ids[0, 0] == 2 and vals[0, 0] == np.inf and ids[1, 0] == 1 and vals[1, 0] == 1.0
