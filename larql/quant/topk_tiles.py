"""The k largest entries of x @ W.T for a batch of activations, on argmax_tiles' int8 copy of a Q8_0 matrix.

An edit's value step asks, for every scored row (15,000 at 1,000 facts), which 256 of Gemma 3's
262,144 tokens are likeliest: a float32 GEMM of 2 x 640 flops per token and row, ~1.8 ms a row at
the machine's float32 rate. Here, as argmax.py does for one activation, in two passes:

1. **Approximate scores.** Each activation is quantized as llama.cpp quantizes it (Q8_0) and every
   row scored by int8 dot products on the tiled copy (argmax_tiles.py): one 64-byte load of 16
   rows' codes feeds TB activations' vpdpbusd (64 products each), and a thread keeps a chunk of
   tiles in its cache while every activation of the batch passes over it.
2. **Exact rescoring.** With E_r = |w_r| * slack (argmax.py's bound, |A_r - w_r . x| <= E_r), the
   k-th largest lower bound A_r - E_r is at most the k-th largest exact score, so a row with
   A_r + E_r below it is not among the k largest; the rest (a few hundred to a few thousand rows
   on Gemma 3, E_r ~1 logit) are scored exactly, in float64, and ranked (ties: the lower id).

The result is the top k of the exact product, which the float32 GEMM path also returns up to its
own rounding (it may order two scores within ~1e-6 of each other the other way).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

from larql.quant import isa
from larql.quant.argmax_tiles import ROWS, Tiled, quantize_signed, tile_scores_avx2
from larql.quant.ir_parts import splat
from larql.quant.kernels import F16_TO_F32
from larql.quant.q8_bounds import bound_slack, rounding

TB = 8  # activations per tile visit: each 64-byte weight load feeds TB vpdpbusd
BATCH = 64  # activations scored together (their approximate scores: 64 MB on Gemma 3)
TILES_PER_TASK = 48  # ~0.5 MB of tiles (Gemma 3's 640 columns): a thread's share that stays in its L2
_I8, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
_V64I8, _V16I32, _V16F32 = ir.VectorType(_I8, 64), ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)
_V16F16 = ir.VectorType(ir.HalfType(), 16)


@intrinsic
def _tile_scores_batch(typingctx, packed, scales, xq, corr, dx, t, b0, out):  # type: ignore[no-untyped-def]
    """A of tile t's 16 rows for activations b0 .. b0 + TB - 1 into out[b, 16 t .. 16 t + 15].

    argmax_tiles._tile_scores for TB activations at once, each with the same arithmetic (so the
    same bits): per block k, int32 accumulators starting at corr[b, k] = -128 sum q_x take the
    eight vpdpbusd of the block (exact), then fma(float(s), f16->f32(d_w) x dx[b, k], acc[b]).
    xq: the activations' codes as int32 (4 codes each) `[B, n / 4]`; corr, dx `[B, nb]`."""
    sig = types.void(packed, scales, xq, corr, dx, t, b0, out)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        a = signature.args
        arrays = [context.make_array(a[i])(context, builder, args[i]) for i in (0, 1, 2, 3, 4, 7)]
        p_arr, s_arr, x_arr, c_arr, d_arr, o_arr = arrays

        def row(arr, r):  # type: ignore[no-untyped-def]
            stride = cgutils.unpack_tuple(builder, arr.strides)[0]
            return builder.gep(arr.data, [builder.mul(r, stride)], source_etype=_I8)

        t_v, b0_v = args[5], args[6]
        nb = builder.sdiv(cgutils.unpack_tuple(builder, p_arr.shape)[1], ir.Constant(_I64, 512))
        p_row, s_row = row(p_arr, t_v), row(s_arr, t_v)
        b_rows = [builder.add(b0_v, ir.Constant(_I64, b)) for b in range(TB)]
        x_rows = [row(x_arr, r) for r in b_rows]
        c_rows = [row(c_arr, r) for r in b_rows]
        d_rows = [row(d_arr, r) for r in b_rows]
        dp = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16I32, [_V16I32, _V64I8, _V64I8]),
                                            "llvm.x86.avx512.vpdpbusd.512")
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16F32, [_V16F32] * 3), "llvm.fma.v16f32")
        accs = [cgutils.alloca_once_value(builder, ir.Constant(_V16F32, None)) for _ in range(TB)]
        with cgutils.for_range(builder, nb) as loop:
            k = loop.index
            base = builder.mul(k, ir.Constant(_I64, 512))
            parts = [splat(builder, builder.load(builder.gep(c, [k], source_etype=_I32), typ=_I32), _V16I32)
                     for c in c_rows]
            for g in range(8):
                w = builder.load(builder.gep(p_row, [builder.add(base, ir.Constant(_I64, 64 * g))], source_etype=_I8),
                                 typ=_V64I8, align=1)
                at = builder.add(builder.mul(k, ir.Constant(_I64, 8)), ir.Constant(_I64, g))
                for b in range(TB):
                    x4 = builder.load(builder.gep(x_rows[b], [at], source_etype=_I32), typ=_I32)
                    parts[b] = builder.call(dp, [parts[b], w, builder.bitcast(splat(builder, x4, _V16I32), _V64I8)])
            d16 = builder.load(builder.gep(s_row, [builder.mul(k, ir.Constant(_I64, 32))], source_etype=_I8),
                               typ=_V16F16, align=1)
            dw = builder.fpext(d16, _V16F32)
            for b in range(TB):
                dxk = builder.load(builder.gep(d_rows[b], [k], source_etype=_F32), typ=_F32)
                scale = builder.fmul(dw, splat(builder, dxk, _V16F32))
                builder.store(builder.call(fma, [builder.sitofp(parts[b], _V16F32), scale, builder.load(accs[b])]),
                              accs[b])
        for b in range(TB):
            dst = builder.gep(row(o_arr, b_rows[b]), [builder.mul(t_v, ir.Constant(_I64, ROWS * 4))], source_etype=_I8)
            builder.store(builder.load(accs[b]), builder.bitcast(dst, _V16F32.as_pointer()), align=4)

    return sig, codegen


@njit(cache=True, parallel=True)
def _quantize_batch(x: NDArray[np.float32], c: float) -> tuple[NDArray[np.int8], NDArray[np.int32],
                                                               NDArray[np.float32], NDArray[np.float64]]:  # pragma: no cover - numba
    """Each activation of x `[B, n]` by argmax_tiles.quantize_signed: (codes, corr, dx, slack), slack
    argmax.py's (|A_r - w_r . x| <= |w_r| * slack, c its rounding)."""
    n_act, n = x.shape
    nb = n // 32
    xq = np.empty((n_act, n), dtype=np.int8)
    corr = np.empty((n_act, nb), dtype=np.int32)
    dx = np.empty((n_act, nb), dtype=np.float32)
    slack = np.empty(n_act, dtype=np.float64)
    for b in prange(n_act):
        err, hat = quantize_signed(x[b], xq[b], corr[b], dx[b])
        slack[b] = bound_slack(x[b], err, hat, c)
    return xq, corr, dx, slack


@njit(cache=True, parallel=True)
def batch_scores(packed: NDArray[np.uint8], scales: NDArray[np.uint16], x: NDArray[np.float32],
                 out: NDArray[np.float32], c: float) -> NDArray[np.float64]:  # pragma: no cover - numba
    """A `[B, n_tiles * 16]` (out) of every tiled row for each activation x `[B, n]` (B a multiple of
    TB); returns each activation's slack (argmax.py: |A_r - w_r . x| <= |w_r| * slack, c its rounding)."""
    n_act = x.shape[0]
    if n_act % TB:
        raise ValueError("batch_scores: the activations come in whole groups of TB")  # the intrinsic reads TB rows
    xq, corr, dx, slack = _quantize_batch(x, c)
    x32 = xq.view(np.int32)
    n_tiles = packed.shape[0]
    n_tasks = (n_tiles + TILES_PER_TASK - 1) // TILES_PER_TASK
    for task in prange(n_tasks):
        for b0 in range(0, n_act, TB):
            for t in range(task * TILES_PER_TASK, min(n_tiles, (task + 1) * TILES_PER_TASK)):
                _tile_scores_batch(packed, scales, x32, corr, dx, t, b0, out)  # type: ignore[call-arg]
    return slack


@njit(cache=True, parallel=True)
def batch_scores_avx2(packed: NDArray[np.uint8], scales: NDArray[np.uint16], x: NDArray[np.float32],
                      out: NDArray[np.float32], c: float) -> NDArray[np.float64]:  # pragma: no cover - numba
    """`batch_scores` on the AVX2 tier: argmax_tiles' AVX2 kernel an activation at a time (the same A,
    bit for bit), a task's tiles kept in cache while every activation passes over them."""
    n_act = x.shape[0]
    xq, _, dx, slack = _quantize_batch(x, c)
    x32 = xq.view(np.int32)
    n_tiles = packed.shape[0]
    n_tasks = (n_tiles + TILES_PER_TASK - 1) // TILES_PER_TASK
    for task in prange(n_tasks):
        for b in range(n_act):
            xb, db, ob = x32[b], dx[b], out[b]
            for t in range(task * TILES_PER_TASK, min(n_tiles, (task + 1) * TILES_PER_TASK)):
                tile_scores_avx2(packed, scales, xb, db, t, ob)  # type: ignore[call-arg]
    return slack


@njit(cache=True, parallel=True)
def candidates(approx: NDArray[np.float32], n_rows: int, norms: NDArray[np.float64], slack: NDArray[np.float64],
               k: int, keep: NDArray[np.bool_]) -> None:  # pragma: no cover - numba
    """keep[b, r]: row r may be among the k largest exact scores of activation b (module docstring)."""
    for b in prange(approx.shape[0]):
        s = slack[b]
        low = np.full(k, -np.inf)  # the k largest lower bounds so far, ascending
        for r in range(n_rows):
            v = np.float64(approx[b, r]) - norms[r] * s
            if v > low[0]:
                j = 0
                while j + 1 < k and low[j + 1] < v:
                    low[j] = low[j + 1]
                    j += 1
                low[j] = v
        m = low[0]
        for r in range(n_rows):
            keep[b, r] = np.float64(approx[b, r]) + norms[r] * s >= m


@njit(cache=True, fastmath=True, inline="always")
def _dot4(raw: NDArray[np.uint8], codes: NDArray[np.int8], f16: NDArray[np.float32], rows: NDArray[np.int64],
          j: int, x: NDArray[np.float64], out: NDArray[np.float64]) -> None:  # pragma: no cover - numba
    """out[j .. j + 3] = the exact scores of Q8_0 rows rows[j .. j + 3] for x, four rows side by side
    (a lone row waits on memory at each of its cache lines; four keep four loads in flight: 2.3x).
    A block (34 bytes): byte 0-1 d (f16) | 2 .. 33 32 x int8 q; score = sum_k d_k sum_i q_i x_i."""
    r0, r1, r2, r3 = rows[j], rows[j + 1], rows[j + 2], rows[j + 3]
    t0 = t1 = t2 = t3 = 0.0
    for blk in range(raw.shape[1] // 34):
        o = 34 * blk
        b0 = b1 = b2 = b3 = 0.0
        for i in range(32):
            xv = x[32 * blk + i]
            b0 += np.float64(codes[r0, o + 2 + i]) * xv
            b1 += np.float64(codes[r1, o + 2 + i]) * xv
            b2 += np.float64(codes[r2, o + 2 + i]) * xv
            b3 += np.float64(codes[r3, o + 2 + i]) * xv
        t0 += np.float64(f16[np.uint16(raw[r0, o]) | (np.uint16(raw[r0, o + 1]) << np.uint16(8))]) * b0
        t1 += np.float64(f16[np.uint16(raw[r1, o]) | (np.uint16(raw[r1, o + 1]) << np.uint16(8))]) * b1
        t2 += np.float64(f16[np.uint16(raw[r2, o]) | (np.uint16(raw[r2, o + 1]) << np.uint16(8))]) * b2
        t3 += np.float64(f16[np.uint16(raw[r3, o]) | (np.uint16(raw[r3, o + 1]) << np.uint16(8))]) * b3
    out[j], out[j + 1], out[j + 2], out[j + 3] = t0, t1, t2, t3


@njit(cache=True, parallel=True, fastmath=True)
def rescore(raw: NDArray[np.uint8], f16: NDArray[np.float32], x: NDArray[np.float32], keep: NDArray[np.bool_],
            out: NDArray[np.int64]) -> None:  # pragma: no cover - numba
    """out[b]: the k = out.shape[1] rows kept for activation b with the largest exact scores (float64),
    descending; an equal score (a repeated row: the same sums in the same order) puts the lower row first."""
    k = out.shape[1]
    codes = raw.view(np.int8)
    for b in prange(x.shape[0]):
        ids = np.flatnonzero(keep[b])
        n = len(ids)
        rows = np.empty(n + 3, np.int64)
        rows[:n] = ids
        rows[n:] = ids[0]  # the last group of four padded with a row already scored
        score = np.empty(n + 3)
        xb = x[b].astype(np.float64)
        for j in range(0, n, 4):
            _dot4(raw, codes, f16, rows, j, xb, score)
        order = np.argsort(-score[:n], kind="mergesort")  # stable: equal scores keep the ascending row order
        for j in range(k):
            out[b, j] = ids[order[j]]


def in_range(tiled: Tiled, x: NDArray[np.float32]) -> bool:
    """Whether every int8 score, partial sum and bound for the activations x `[t, n]` stays finite in
    float32: each is at most |w_r| |x̂| (a block's dot by Cauchy-Schwarz, summed over the blocks), and
    |x̂| <= 1.01 |x|; past that (or for x not finite) the float32 path ranks them."""
    if not np.isfinite(x).all():
        return False
    x64 = x.astype(np.float64)
    largest = float(np.sqrt(np.max(np.einsum("ij,ij->i", x64, x64))))
    return largest * float(tiled.norms.max(initial=0.0)) < 1e36


def top_k(tiled: Tiled, raw: NDArray[np.uint8], x: NDArray[np.float32], k: int) -> NDArray[np.int64]:
    """Per activation of x `[t, n]` (`in_range`), the ids of the k largest of x @ W.T for W the Q8_0 rows
    raw `[rows, bytes]` (tiled: their argmax_tiles copy), by exact score descending, an equal score
    keeping the lower id."""
    n_rows = tiled.n_rows
    k = min(k, n_rows)
    out = np.empty((len(x), max(k, 0)), np.int64)
    if k <= 0:
        return out
    padded = np.zeros((BATCH, x.shape[1]), np.float32)
    approx = np.empty((BATCH, tiled.packed.shape[0] * ROWS), np.float32)
    keep = np.empty((BATCH, n_rows), np.bool_)
    score = batch_scores_avx2 if isa.TIER == "avx2" else batch_scores  # the tier's kernel (isa)
    for lo in range(0, len(x), BATCH):
        part = x[lo: lo + BATCH]
        padded[: len(part)] = part
        padded[len(part):] = 0.0
        n_act = -(-len(part) // TB) * TB
        slack = score(tiled.packed, tiled.scales, padded[:n_act], approx[:n_act], rounding(x.shape[1]))
        candidates(approx[: len(part)], n_rows, tiled.norms, slack[: len(part)], k, keep[: len(part)])
        rescore(raw, F16_TO_F32, part, keep[: len(part)], out[lo: lo + len(part)])
    return out
