"""Exact top-k tokens per feature for down_meta: the unembedding prepared once, then per layer an
approximate pass with a proven bound and exact rescoring (topk_kernels has the derivation).

Three approximate passes give the same result: the int8 one on the avx512vnni tier
(larql.quant.isa; topk_kernels.scan_int8), its AVX2 form with 7-bit feature codes on the avx2 tier
(topk_avx2.scan_avx2: a wider bound, more candidates rescored), a float32 sgemm per vocabulary
chunk on the float32 tier. Inputs that are not finite, or so
large that float32 could overflow, take today's plain float32 scan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
from numpy.typing import NDArray

from larql.quant import isa
from larql.quant.argmax import topk_update
from larql.vindex import topk_avx2
from larql.vindex import topk_kernels as tk

VOCAB_CHUNK = 16384  # rows per GEMM / per quantization step
WIDE, WIDE_BYTES = 1 << 15, 64 << 20  # candidate slots per feature, and in all, after a first overflow
PANEL = 256  # features per thread task in the int8 pass (their codes: 160 KB at 640 columns, L2)
_HUGE = 2.0 ** 100  # ||u|| ||w|| beyond this: float32 scores could overflow


def _up(x: NDArray[np.float64]) -> NDArray[np.float32]:
    """float32 values at least x (x >= 0)."""
    return (x * (1 + 2.0 ** -22) + 2.0 ** -149).astype(np.float32)


@dataclass(frozen=True)
class Tokens:
    """The unembedding `(vocab, hidden)` float32 with what both passes need; `packed` and the rest
    of the int8 side only when the int8 pass runs."""

    u: NDArray[np.float32]
    tier: str  # larql.quant.isa's: which int8 kernel runs (float32: none)
    norm: NDArray[np.float32]  # ||u_t|| rounded up
    norm_max: float
    err_max: float  # max ||u_t - u^_t|| (int8 side)
    packed: NDArray[np.uint8] | None  # (tiles, 1024 nb), topk_kernels.pack_tokens (avx2: as int8)
    tsc: NDArray[np.float32] | None  # (tiles, 32 nb)
    tnorm: NDArray[np.float32] | None  # (tiles, 64): ||u|| of the tile's 32 tokens, then ||u - u^||
    safe: bool  # finite and small enough for the bounded passes
    corr: NDArray[np.int32] | None = None  # (tiles, 32 nb): topk_avx2.token_corr (avx2 only)


def prepare(u: NDArray[np.float32], tier: str | None = None) -> Tokens:
    """The unembedding's norms and, on an int8 tier (default: isa.TIER), its int8 tiles (~hidden
    bytes a token: 168 MB for Gemma 3's 262,144 x 640), built in vocabulary chunks."""
    n, h = u.shape
    tier = isa.TIER if tier is None else tier
    if tier == "float32" or not np.isfinite(u).all():
        norm64 = np.empty(n)
        for a in range(0, n, VOCAB_CHUNK):
            norm64[a:a + VOCAB_CHUNK] = np.linalg.norm(u[a:a + VOCAB_CHUNK].astype(np.float64), axis=1) * (1 + 1e-12)
        norm_max = float(norm64.max(initial=0.0))
        return Tokens(u, "float32", _up(norm64), norm_max, 0.0, None, None, None,
                      bool(np.isfinite(norm_max) and norm_max < _HUGE))
    norm64 = np.empty(n)
    nb, tiles = -(-h // 32), -(-n // tk.TILE)
    packed = np.empty((tiles, 1024 * nb), np.uint8)
    tsc = np.empty((tiles, 32 * nb), np.float32)
    tnorm = np.zeros((tiles, 2 * tk.TILE), np.float32)
    corr = np.empty((tiles, 32 * nb), np.int32) if tier == "avx2" else None
    err_max = 0.0
    for a in range(0, n, VOCAB_CHUNK):  # VOCAB_CHUNK is a multiple of TILE
        rows = u[a:a + VOCAB_CHUNK]
        m = len(rows)
        codes, scales = np.empty((m, 32 * nb), np.int8), np.empty((m, nb), np.float32)
        nrm, err, hat = np.empty(m), np.empty(m), np.empty(m)
        tk.quantize_blocks(np.ascontiguousarray(rows), codes, scales, nrm, err, hat, 127.0)
        norm64[a:a + m] = nrm
        t0, t1 = a // tk.TILE, a // tk.TILE + -(-m // tk.TILE)
        tk.pack_tokens(codes, scales, packed[t0:t1], tsc[t0:t1])
        if corr is not None:
            corr[t0:t1] = topk_avx2.token_corr(codes, t1 - t0)
        pad = (t1 - t0) * tk.TILE - m
        tnorm[t0:t1, :tk.TILE] = np.pad(_up(nrm), (0, pad)).reshape(-1, tk.TILE)
        tnorm[t0:t1, tk.TILE:] = np.pad(_up(err), (0, pad)).reshape(-1, tk.TILE)
        err_max = max(err_max, float(err.max(initial=0.0)))
    norm_max = float(norm64.max(initial=0.0))
    if tier == "avx2":
        packed ^= np.uint8(0x80)  # the codes signed: the AVX2 kernel's operand (topk_avx2)
    return Tokens(u, tier, _up(norm64), norm_max, err_max, packed, tsc, tnorm, norm_max < _HUGE, corr)


State = tuple[NDArray[np.float64], NDArray[np.int32], NDArray[np.float64], NDArray[np.int32], NDArray[np.bool_]]


def _state(n_feat: int, k: int, cap: int) -> State:
    """(lotop, cand_t, cand_hi, cand_n, over) for n_feat features: the k largest lower bounds so far
    (-inf to start), the candidate buffers (cap slots each), their fill, the overflow marks."""
    return (np.full((n_feat, k), -np.inf), np.empty((n_feat, cap), np.int32), np.empty((n_feat, cap)),
            np.zeros(n_feat, np.int32), np.zeros(n_feat, np.bool_))


def _int8_pass(tok: Tokens, wt: NDArray[np.float32], k: int, cap: int) -> State:
    """The int8 pass: W^T's rows quantized per 32 columns (7-bit codes for the AVX2 kernel), padded
    to MR rows, then the tier's scan."""
    assert tok.packed is not None and tok.tsc is not None and tok.tnorm is not None
    f, h = wt.shape
    nb = tok.tsc.shape[1] // 32
    fp = -(-f // tk.MR) * tk.MR
    x = np.zeros((fp, h), np.float32)
    x[:f] = wt
    codes, scales = np.empty((fp, 32 * nb), np.int8), np.empty((fp, nb), np.float32)
    nw, ew, nwh = np.empty(fp), np.empty(fp), np.empty(fp)
    avx2 = tok.tier == "avx2"
    tk.quantize_blocks(x, codes, scales, nw, ew, nwh, topk_avx2.QMAX if avx2 else 127.0)
    g = 1.01 * (nb + 1) * 2.0 ** -24
    wterm = np.zeros((fp, 4), np.float32)
    wterm[:, 0] = _up(ew + g * nwh + 2.0 ** -23 * nw)
    wterm[:, 1] = _up((1 + g) * nwh)
    wterm[:, 2] = np.where(np.arange(fp) < f, -np.inf, np.inf)  # padding rows never pass
    tau = tk.tau(32 * nb)
    kf = 2.0 ** -20 * (tok.norm_max + tok.err_max) * (2 * nwh + wterm[:, 0] + wterm[:, 1]) + 2 * tau
    state = _state(fp, k, cap)
    if avx2:  # numba compiles a kernel on its first call: the VNNI one never on this tier
        assert tok.corr is not None
        wcodes = codes.view(np.uint8) + np.uint8(topk_avx2.OFFSET)  # c + 64: 1..127
        topk_avx2.scan_avx2(tok.packed, tok.tsc, tok.tnorm, tok.corr, tok.u.shape[0], wcodes, scales, wterm, tau,
                            state[0], kf, *state[1:], PANEL)
    else:
        corr = (-128 * codes.reshape(fp, nb, 32).sum(axis=2, dtype=np.int32)).astype(np.int32)  # the +128 back
        tk.scan_int8(tok.packed, tok.tsc, tok.tnorm, tok.u.shape[0], codes, scales, corr, wterm, tau, state[0], kf,
                     *state[1:], PANEL)
    return state


def _f32_pass(tok: Tokens, wt: NDArray[np.float32], k: int, cap: int) -> State:
    """The float32 pass: sgemm per vocabulary chunk (BLAS's threads), bound ||u|| ||w|| (1.01 h 2^-24
    + 2^-23) for any summation order."""
    f, h = wt.shape
    nw = np.linalg.norm(wt.astype(np.float64), axis=1) * (1 + 1e-12)
    wterm = np.zeros((f, 4), np.float32)
    wterm[:, 0] = _up(nw * (1.01 * h * 2.0 ** -24 + 2.0 ** -23))
    wterm[:, 2] = -np.inf
    tau = tk.tau(h)
    kf = 2.0 ** -20 * tok.norm_max * (2 * nw + wterm[:, 0]) + 2 * tau
    state = _state(f, k, cap)
    scores = np.empty((f, VOCAB_CHUNK), np.float32)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)  # BLAS has the cores; numba's spinning workers would steal them
    try:
        for start in range(0, tok.u.shape[0], VOCAB_CHUNK):
            chunk = tok.u[start:start + VOCAB_CHUNK]
            out = scores[:, :len(chunk)]
            np.matmul(wt, chunk.T, out=out)
            tk.screen_f32(out, start, tok.norm, wterm, tau, state[0], kf, *state[1:])
    finally:
        numba.set_num_threads(threads)
    return state


def exact_top(u: NDArray[np.float32], w: NDArray[np.float32], k: int) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """One feature's top-k over every token, each score exact (rounded to float32): ids, scores."""
    s = np.empty(u.shape[0], np.float32)
    tk.exact_scores(u, np.ascontiguousarray(w), s)
    order = np.argsort(-s, kind="stable")[:k]  # stable: an equal score keeps the lower id first
    return order, s[order]


def top_tokens(tok: Tokens, wt: NDArray[np.float32], k: int) -> tuple[NDArray[np.uint32], NDArray[np.float32]]:
    """For each row w of wt `(features, hidden)`, the k tokens t with the largest u_t . w: ids `(features,
    k)` uint32 and scores float32 (the exact score rounded to float32), by score descending, an equal
    score never displacing a lower id; past the vocabulary's size, id 0 and -inf."""
    wt = np.ascontiguousarray(wt, dtype=np.float32)
    f = wt.shape[0]
    top_ids = np.zeros((f, k), np.uint32)
    top_vals = np.full((f, k), -np.inf, np.float32)
    nw_max = float(np.sqrt((wt.astype(np.float64) ** 2).sum(axis=1)).max(initial=0.0))
    if not (tok.safe and np.isfinite(nw_max) and tok.norm_max * nw_max < _HUGE):
        _plain(tok.u, wt, top_ids, top_vals)
        return top_ids, top_vals
    # the first pass for every feature, then the features whose candidates outgrew their slots again
    # with wider buffers, then through the float32 pass (its bound ~1/500 of the int8 one's)
    passes = [_int8_pass, _int8_pass, _f32_pass] if tok.packed is not None else [_f32_pass, _f32_pass]
    rest = np.arange(f)
    for n, run in enumerate(passes):
        if not len(rest):
            break
        sub = wt if n == 0 else wt[rest]
        first = tk.CAP * (2 if tok.tier == "avx2" else 1)  # the 7-bit pass's wider bound: more candidates
        cap = first if n == 0 else max(first, min(WIDE, WIDE_BYTES // (12 * len(rest))))
        lotop, cand_t, cand_hi, cand_n, over = run(tok, sub, k, cap)
        m = len(rest)
        ids, vals = np.zeros((m, k), np.uint32), np.full((m, k), -np.inf, np.float32)
        tk.finish(tok.u, sub, lotop[:m], cand_t[:m], cand_hi[:m], cand_n[:m], over[:m], ids, vals)
        top_ids[rest], top_vals[rest] = ids, vals
        rest = rest[over[:m]]
    for i in rest:  # still more candidates than slots: many tokens within float32 rounding of each other
        best, scores = exact_top(tok.u, wt[i], k)
        top_ids[i, :len(best)], top_vals[i, :len(best)] = best, scores
    return top_ids, top_vals


def _plain(u: NDArray[np.float32], wt: NDArray[np.float32], top_ids: NDArray[np.uint32],
           top_vals: NDArray[np.float32]) -> None:
    """Inputs the bounds do not cover (inf, nan, overflowing scores): the float32 sgemm scores
    ranked as they come out (down_meta's only pass before the bounded ones)."""
    scores = np.empty((wt.shape[0], VOCAB_CHUNK), np.float32)
    for start in range(0, u.shape[0], VOCAB_CHUNK):
        out = scores[:, :len(u[start:start + VOCAB_CHUNK])]
        with np.errstate(invalid="ignore", over="ignore"):  # inf x 0 is nan, which never ranks
            np.matmul(wt, u[start:start + VOCAB_CHUNK].T, out=out)
        topk_update(out, start, top_ids, top_vals)
