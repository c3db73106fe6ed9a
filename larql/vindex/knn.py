"""Gate KNN: exact top-k features by |gate . query|, sign kept, two ways.

Once numba is loaded (a process that runs the model: INFER, DESCRIBE's probes, `larql serve`), a
layer's gates are read once per query through an int8 copy (per-row scale, built on first use and
kept by the store: half the bytes of the f16 rows), which gives every feature an approximate score
a and a bound e on |exact - a|: the row's rounding to int8 (||g - g8||, kept per row, times ||q||,
Cauchy-Schwarz) plus float32 summation error. The k-th largest |a| - e is at most the k-th largest
exact |score|, so a feature whose |a| + e is below it cannot be in the top k; the rest (a few
percent of the rows) are rescored exactly from the stored rows: the exact top-k, proven per query.
At Gemma-3-4B shapes (10,240 x 2,560 f16) that reads 26 MB instead of two scans of 52 MB. With
AVX-512 VNNI the scores are integer dot products: the query too is quantized (per 32 values a
scale, two int8 digits per value held as an int16, so its rounding error, a third term of e, is
~1/50 of the row's) and vpdpwssd multiplies it by the int8 rows (approx_bounds has the bound's
derivation); AVX2 forms the same int32 sums with vpmaddwd; on the float32 tier the int8 codes are
widened to float32 and multiplied by q.

A process that only browses keeps faiss, so that opening a vindex and a KNN load no numba (the
cold start, tests/test_facade.py): faiss's flat inner-product index returns the largest scores;
searching with q and with -q gives the k most positive and the k most negative, and the k largest
by magnitude are among those 2k. An f16 vindex uses faiss's fp16 scalar quantizer fed the stored
half-precision bytes directly (decoding fp16 is exact). Both ways give the same features; their
float32 scores may differ in the last bits (summation order).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from larql.errors import VindexError


@dataclass(frozen=True)
class Int8Gates:
    """A layer's gate rows as int8 codes `(n, hidden)` times a per-row scale, with the bound terms.
    The codes' rows are padded with zeros to a multiple of 32 columns (the VNNI pass's blocks)."""

    codes: NDArray[np.int8]
    scales: NDArray[np.float32]  # (n,) a row is codes * scale
    err: NDArray[np.float64]  # (n,) ||g - codes * scale||_2, computed in float64
    absmax: NDArray[np.float64]  # (n,) max |codes * scale|, for the summation-error term
    gnorm: NDArray[np.float64]  # (n,) ||codes * scale||_2, rounded up, for the query's rounding


def build_index(gates: NDArray[np.floating]) -> Any:
    """A faiss flat inner-product index over gate vectors `(features, hidden)` in their stored dtype."""
    import faiss

    hidden = gates.shape[1]
    index: faiss.Index
    if gates.dtype == np.float16:
        index = faiss.IndexScalarQuantizer(hidden, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        index.add_sa_codes(np.ascontiguousarray(gates).view(np.uint8))
    else:
        index = faiss.IndexFlatIP(hidden)
        index.add(np.ascontiguousarray(gates, dtype=np.float32))
    return index


def faiss_top_abs(index: Any, q: NDArray[np.float32], k: int) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """(feature ids, scores) of the k largest |gate . q| (and up to k more), from two faiss searches."""
    scores, ids = index.search(np.stack([q, -q]), k)  # (2, k) each
    cand_ids = np.concatenate([ids[0], ids[1]])
    cand_scores = np.concatenate([scores[0], -scores[1]])
    keep = cand_ids >= 0
    cand_ids, cand_scores = cand_ids[keep], cand_scores[keep]
    _, first = np.unique(cand_ids, return_index=True)  # a feature can appear in both lists when n < 2k
    return cand_ids[first].astype(np.int64), cand_scores[first].astype(np.float64)


def build_int8(gates: NDArray[np.floating]) -> Int8Gates:
    """The int8 copy of gate vectors `(features, hidden)` (any float dtype), in chunks of rows."""
    from larql.vindex import knn_kernels  # numba: loaded with the first KNN, not with the store

    n, h = gates.shape
    codes = np.zeros((n, -(-h // 32) * 32), np.int8)
    scales, err, absmax, gnorm = np.empty(n, np.float32), np.empty(n), np.empty(n), np.empty(n)
    for lo in range(0, n, 1024):
        rows = slice(lo, min(n, lo + 1024))
        knn_kernels.quantize_rows(np.asarray(gates[rows], dtype=np.float32), codes[rows], scales[rows], err[rows],
                                  absmax[rows], gnorm[rows])
    return Int8Gates(codes, scales, err, absmax, gnorm)


def approx_bounds(index: Int8Gates, q: NDArray[np.float32],
                  tier: str | None = None) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(lo, hi) per feature: |approx| -/+ a bound on |approx - F|, F the float32 score the rescoring
    computes from the stored row (so lo <= |F| <= hi). q: `(hidden,)` float32, finite.

    int8 x int16 (`tier` "avx512vnni", vpdpwssd, or "avx2", vpmaddwd: the same sums, so the same lo
    and hi; default: the tier larql runs, `isa.TIER`): with g the stored row, g^ =
    c * s its int8 copy, q^ the query in two int8 digits per value held as one int16 (per 32 values
    a scale, knn_kernels.quantize_query) and A the pass's score (every block's int32 dot exact, times the
    query block's scale, summed in float32 over 4 x 8 lanes and n_b = hp/32 blocks, each term
    rounded at most n_b + 14 times; times s in float64, exactly),
      |g.q - g^.q|   <= ||g - g^|| ||q||                     (Cauchy-Schwarz; err, kept per row)
      |g^.q - g^.q^| <= ||g^|| ||q - q^||                    (Cauchy-Schwarz; gnorm, kept per row)
      |A - g^.q^|    <= c ||g^|| ||q^|| + s n_f 2^-150       (the float32 sum of the scaled int32
                        dots: sum_j |c_j q^_j| <= ||c|| ||q^||, c = 1.01 (n_b + 16)
                        2^-24; the second term for products and sums that underflow, n_f <= 16 n_b + 31)
      |F - g.q|      <= h 2^-23 ||g|| ||q||                  (2x the worst float32 error of a sum of
                        h products in any order, the rescoring: sum_j |g_j q_j| <= ||g|| ||q||,
                        ||g|| <= ||g^|| + ||g - g^||)
    and the bound is their sum (h taken as hp, the padded width), times 1 + 1e-9 for the float64
    arithmetic that forms it. The int32 dots need no limit on h: each block's is turned into float32
    on its own. With q^ off q by ~1/512 of a block's scale per value, the second term is ~1/50 of
    the first, and the bound is narrower than the int8 x float32 pass's (below): fewer rows rescored.

    int8 x float32 (the float32 tier, or a query too large or not finite): A = s * sum_j c_j q_j in float32,
    whose summation error and the rescoring's are within h 2^-21 max|g^| ||q||_1 (8x the worst of
    one), plus the first term above."""
    from larql.vindex import knn_kernels

    n, hp = index.codes.shape
    qp = np.zeros(hp, np.float32)
    qp[:len(q)] = q
    q_l1, q_l2 = float(np.abs(q).sum(dtype=np.float64)), float(np.linalg.norm(q.astype(np.float64)))
    lo, hi = np.empty(n), np.empty(n)
    tier = knn_kernels.TIER if tier is None else tier
    if tier in ("avx512vnni", "avx2") and q_l1 < 2.0 ** 100:  # finite, no float32 overflow
        nb = hp // 32
        q16, dq = np.empty(hp, np.int16), np.empty(nb, np.float32)
        q_err, q_hat = knn_kernels.quantize_query(qp, q16, dq)
        q_term = q_err + 1.01 * (nb + 16) * 2.0 ** -24 * q_hat
        bounds = knn_kernels.vnni_bounds if tier == "avx512vnni" else knn_kernels.avx2_bounds
        bounds(index.codes, index.scales, index.err, index.gnorm, q16, dq, q_l2, q_term,
               q_l2 * hp * 2.0 ** -23, (16 * nb + 32) * 2.0 ** -150, lo, hi)
    else:
        knn_kernels.int8_bounds(index.codes, index.scales, index.err, index.absmax, qp, q_l2, q_l1 * hp * 2.0 ** -21, lo, hi)
    return lo, hi


def top_abs(gates: NDArray[np.floating], index: Int8Gates, q: NDArray[np.float32], k: int,
            tier: str | None = None) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """(feature ids, exact float32 scores) of at least the k largest |gate . q|, unsorted; `tier`:
    approx_bounds's (None: the tier larql runs)."""
    from larql.vindex import knn_kernels
    n = index.codes.shape[0]
    lo, hi = approx_bounds(index, q, tier)
    if k >= n:
        cand = np.arange(n)
    else:
        floor = np.partition(lo, n - k)[n - k]  # k features have |exact| >= this
        cand = np.flatnonzero(hi >= floor)
    if gates.dtype == np.float16:
        exact = np.empty(len(cand), np.float32)
        knn_kernels.rescore_f16(gates.view(np.uint16), cand, q, exact)
    else:
        exact = np.asarray(gates[cand], dtype=np.float32) @ q  # (candidates,) the stored rows, float32
    return cand, exact.astype(np.float64)


class GateStore(Protocol):
    """What gate KNN reads of a store (vindex/store.py Vindex): its width, a layer's gate vectors
    and the two search structures built from them (this module's), kept by the store."""

    hidden: int

    def num_features(self, layer: int) -> int: ...

    def gate_vectors(self, layer: int) -> NDArray[np.floating]: ...

    def gate_index(self, layer: int) -> Any: ...

    def gate_int8(self, layer: int) -> Int8Gates: ...


def gate_knn(v: GateStore, layer: int, query: NDArray[np.float32], k: int = 10,
             gates: Mapping[int, NDArray[np.float32]] | None = None,
             deleted: AbstractSet[int] = frozenset()) -> list[tuple[int, float]]:
    """[(feature, score)] for the k largest |score| at `layer`, sorted by |score| descending.

    `gates` (feature -> replacement gate vector) and `deleted` are an editable view's edits of the
    layer: edited features are rescored with their new gate, deleted ones never returned.
    """
    n = v.num_features(layer)
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    if q.shape[0] != v.hidden:
        raise VindexError(f"gate KNN query has {q.shape[0]} values; this vindex's hidden size is {v.hidden}")
    if k < 1:
        raise VindexError(f"gate KNN needs k >= 1, got {k}")
    k = min(k, n)
    edited = gates or {}
    # with edits: search wider, rescore overridden gates, drop deleted features, re-rank
    wide = min(n, k + len(edited) + len(deleted))
    if "numba" in sys.modules:  # loaded already: the int8 pass costs no import
        cand_ids, cand_scores = top_abs(v.gate_vectors(layer), v.gate_int8(layer), q, wide)
    else:
        cand_ids, cand_scores = faiss_top_abs(v.gate_index(layer), q, wide)
    if edited or deleted:
        rescored = {int(f): float(s) for f, s in zip(cand_ids, cand_scores)}
        for f, gate in edited.items():
            rescored[f] = float(gate @ q)
        for f in deleted:
            rescored.pop(f, None)
        cand_ids = np.fromiter(rescored, dtype=np.int64, count=len(rescored))
        cand_scores = np.fromiter(rescored.values(), dtype=np.float64, count=len(rescored))
    order = np.lexsort((cand_ids, -np.abs(cand_scores)))[:k]
    return [(int(cand_ids[i]), float(cand_scores[i])) for i in order]
