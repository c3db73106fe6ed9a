"""Numba dot-product kernels over raw GGUF blocks: fused matvec and small-batch matmul.

The same conventions as `kernels.py` (contiguous arrays and scalars, cache=True, the weight bytes as
uint8 and int8 views, the 16-bit float table), whose byte readers and dequantizer these reuse. These
use fastmath: they only have to agree with float32 matmul over the dequantized weights within
rounding (`dequantize_rows` is the exact one).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from larql.quant import q8_0_rows
from larql.quant.kernels import (
    BIT,
    T_Q4_0,
    T_Q4_1,
    T_Q4_K,
    T_Q5_0,
    T_Q5_1,
    T_Q6_K,
    T_Q8_0,
    Kernel,
    dequant_block,
    k_scale_min,
    u16r,
    u32r,
)

# Dot products of one dequantized row with x. Each block's weights are dequantized on the fly and
# multiplied into 32 per-lane partial sums that are reduced once per row: a horizontal sum per
# block costs more than the block's arithmetic (Q8_0 on this machine: 3.6 GB/s against 19 GB/s).
# One function per type, so that every offset is a compile-time constant, and loops over low and
# high nibbles kept apart so that they vectorize without AVX2's variable shifts.


@njit(cache=True, fastmath=True, inline="always")
def lane_sum(acc):
    total = np.float32(0.0)
    for i in range(32):
        total += acc[i]
    return total


@njit(cache=True, fastmath=True, inline="always")
def _dot_q8_0(w, wi8, r, tab, x):
    acc = np.zeros(32, dtype=np.float32)
    for k in range(w.shape[1] // 34):
        b, xo = 34 * k, 32 * k
        d = tab[u16r(w, r, b)]
        for i in range(32):
            acc[i] += (np.float32(wi8[r, b + 2 + i]) * d) * x[xo + i]
    return lane_sum(acc)


@njit(cache=True, fastmath=True, inline="always")
def _dot_q4(w, r, tab, x, type_size, has_min):
    """Q4_0 (type_size 18, w = d*q - 8d) and Q4_1 (type_size 20, w = d*q + m)."""
    acc_lo = np.zeros(16, dtype=np.float32)
    acc_hi = np.zeros(16, dtype=np.float32)
    qs = 4 if has_min else 2
    for k in range(w.shape[1] // type_size):
        b, xo = type_size * k, 32 * k
        d = tab[u16r(w, r, b)]
        m = tab[u16r(w, r, b + 2)] if has_min else np.float32(-8.0) * d
        for j in range(16):
            byte = w[r, b + qs + j]
            acc_lo[j] += (d * np.float32(byte & 15) + m) * x[xo + j]
            acc_hi[j] += (d * np.float32(byte >> 4) + m) * x[xo + 16 + j]
    total = np.float32(0.0)
    for j in range(16):
        total += acc_lo[j] + acc_hi[j]
    return total


@njit(cache=True, fastmath=True, inline="always")
def _dot_q5(w, r, tab, x, type_size, has_min):
    """Q5_0 (type_size 22, w = d*q - 16d) and Q5_1 (type_size 24, w = d*q + m)."""
    acc = np.zeros(32, dtype=np.float32)
    hb = 4 if has_min else 2
    sixteen, zero = np.float32(16.0), np.float32(0.0)
    for k in range(w.shape[1] // type_size):
        b, xo = type_size * k, 32 * k
        d = tab[u16r(w, r, b)]
        m = tab[u16r(w, r, b + 2)] if has_min else np.float32(-16.0) * d
        qh = np.uint32(u32r(w, r, b + hb))
        for j in range(16):  # a mask test, not a per-lane shift: no AVX2 here
            q = np.float32(w[r, b + hb + 4 + j] & 15) + (sixteen if qh & BIT[j] else zero)
            acc[j] += (d * q + m) * x[xo + j]
        for j in range(16):
            q = np.float32(w[r, b + hb + 4 + j] >> 4) + (sixteen if qh & BIT[16 + j] else zero)
            acc[16 + j] += (d * q + m) * x[xo + 16 + j]
    return lane_sum(acc)


@njit(cache=True, fastmath=True, inline="always")
def _dot_q4_k(w, r, tab, x):
    acc = np.zeros(32, dtype=np.float32)
    for k in range(w.shape[1] // 144):
        b, xo = 144 * k, 256 * k
        d, dmin = tab[u16r(w, r, b)], tab[u16r(w, r, b + 2)]
        for c in range(4):  # 32-byte chunk c: sub-block 2c in low nibbles, 2c+1 in high
            sc, mn = k_scale_min(w[r], b + 4, 2 * c)
            scale, shift = d * np.float32(sc), dmin * np.float32(mn)
            for i in range(32):
                acc[i] += (scale * np.float32(w[r, b + 16 + 32 * c + i] & 15) - shift) * x[xo + 64 * c + i]
            sc, mn = k_scale_min(w[r], b + 4, 2 * c + 1)
            scale, shift = d * np.float32(sc), dmin * np.float32(mn)
            for i in range(32):
                acc[i] += (scale * np.float32(w[r, b + 16 + 32 * c + i] >> 4) - shift) * x[xo + 64 * c + 32 + i]
    return lane_sum(acc)


@njit(cache=True, fastmath=True, inline="always")
def _dot_q6_k(w, wi8, r, tab, x):
    acc = np.zeros(32, dtype=np.float32)
    for k in range(w.shape[1] // 210):
        b, xo = 210 * k, 256 * k
        d = tab[u16r(w, r, b + 208)]
        for h in range(2):  # each half: 64 ql bytes and 32 qh bytes give 4 groups t of 32 weights
            ql, qh, xh = b + 64 * h, b + 128 + 32 * h, xo + 128 * h
            for half in range(2):  # 16 weights share an int8 scale
                g = b + 192 + 8 * h + half
                s0, s1 = d * np.float32(wi8[r, g]), d * np.float32(wi8[r, g + 2])
                s2, s3 = d * np.float32(wi8[r, g + 4]), d * np.float32(wi8[r, g + 6])
                for i in range(16):
                    c = 16 * half + i
                    lo0, lo1, hi = w[r, ql + c], w[r, ql + 32 + c], w[r, qh + c]
                    q0 = np.float32(np.int32((lo0 & 15) | ((hi & 3) << 4)) - 32)
                    q1 = np.float32(np.int32((lo1 & 15) | (((hi >> 2) & 3) << 4)) - 32)
                    q2 = np.float32(np.int32((lo0 >> 4) | (((hi >> 4) & 3) << 4)) - 32)
                    q3 = np.float32(np.int32((lo1 >> 4) | ((hi >> 6) << 4)) - 32)
                    acc[c] += ((s0 * q0) * x[xh + c] + (s1 * q1) * x[xh + 32 + c]
                               + (s2 * q2) * x[xh + 64 + c] + (s3 * q3) * x[xh + 96 + c])
    return lane_sum(acc)


@njit(cache=True, fastmath=True, inline="always")
def _dot_generic(qtype, w, wi8, r, tab, x, buf, type_size, block_size):
    """F16, BF16, Q5_K: dequantize a block at a time, then multiply-accumulate."""
    acc = np.zeros(32, dtype=np.float32)
    for k in range(w.shape[1] // type_size):
        dequant_block(qtype, w[r], wi8[r], k * type_size, tab, buf, 0)
        xo = k * block_size
        for i in range(block_size):
            acc[i % 32] += buf[i] * x[xo + i]
    return lane_sum(acc)


# One matvec and one small-batch matmul kernel per type: a type switch inside the row loop costs
# 20% (measured on Q8_0), so the Python wrapper picks the kernel instead.


@njit(cache=True, parallel=True)
def matvec_q8_0(w, wi8, tab, x, out):
    """Q8_0 rows by q8_0_rows' register-accumulator kernel (sum_k d_k (q_k . x_k)): Gemma 3's
    262k-row lm_head 7.8 against 8.9 ms (two threads, `_dot_q8_0`'s array of partial sums before),
    near the memory's pace. wi8 and tab are unused (the f16 scale is widened in the kernel), kept
    for the MATVEC table's common signature."""
    for r in prange(w.shape[0]):
        q8_0_rows.row_dot(w, r, x, out)  # type: ignore[call-arg]


@njit(cache=True, fastmath=True, parallel=True)
def matvec_q4_0(w, wi8, tab, x, out):
    for r in prange(w.shape[0]):
        out[r] = _dot_q4(w, r, tab, x, 18, False)


@njit(cache=True, fastmath=True, parallel=True)
def matvec_q4_1(w, wi8, tab, x, out):
    for r in prange(w.shape[0]):
        out[r] = _dot_q4(w, r, tab, x, 20, True)


@njit(cache=True, fastmath=True, parallel=True)
def matvec_q5_0(w, wi8, tab, x, out):
    for r in prange(w.shape[0]):
        out[r] = _dot_q5(w, r, tab, x, 22, False)


@njit(cache=True, fastmath=True, parallel=True)
def matvec_q5_1(w, wi8, tab, x, out):
    for r in prange(w.shape[0]):
        out[r] = _dot_q5(w, r, tab, x, 24, True)


@njit(cache=True, fastmath=True, parallel=True)
def matvec_q4_k(w, wi8, tab, x, out):
    for r in prange(w.shape[0]):
        out[r] = _dot_q4_k(w, r, tab, x)


@njit(cache=True, fastmath=True, parallel=True)
def matvec_q6_k(w, wi8, tab, x, out):
    for r in prange(w.shape[0]):
        out[r] = _dot_q6_k(w, wi8, r, tab, x)


@njit(cache=True, fastmath=True, parallel=True)
def matvec_generic(qtype, block_size, type_size, w, wi8, tab, x, out):
    """F16, BF16, Q5_K: a block dequantized at a time, then multiply-accumulated."""
    for r in prange(w.shape[0]):
        buf = np.empty(block_size, dtype=np.float32)
        out[r] = _dot_generic(qtype, w, wi8, r, tab, x, buf, type_size, block_size)


# Small-batch matmuls: out[t, r] = dot(dequantized w[r], xs[t]) for a few rows of activations xs
# `[t, k]`, row by row, so each weight row comes from memory once and from cache for the other t.
# One kernel per type, like the matvecs: a single kernel with a type switch would inline every type's
# dot product and compile them all; this way a model compiles only its own types.


@njit(cache=True, fastmath=True, inline="always")
def _dot4_q8_0(w, wi8, r, tab, xs, t0, out):
    """`_dot_q8_0` of rows t0..t0+3 of xs at once: each weight widened once for the four (the
    widening is most of a dot's cost); per row the same products and sums, so the same bits."""
    a0, a1 = np.zeros(32, dtype=np.float32), np.zeros(32, dtype=np.float32)
    a2, a3 = np.zeros(32, dtype=np.float32), np.zeros(32, dtype=np.float32)
    x0, x1, x2, x3 = xs[t0], xs[t0 + 1], xs[t0 + 2], xs[t0 + 3]
    for k in range(w.shape[1] // 34):
        b, xo = 34 * k, 32 * k
        d = tab[u16r(w, r, b)]
        for i in range(32):
            wv = np.float32(wi8[r, b + 2 + i]) * d
            a0[i] += wv * x0[xo + i]
            a1[i] += wv * x1[xo + i]
            a2[i] += wv * x2[xo + i]
            a3[i] += wv * x3[xo + i]
    out[t0, r], out[t0 + 1, r] = lane_sum(a0), lane_sum(a1)
    out[t0 + 2, r], out[t0 + 3, r] = lane_sum(a2), lane_sum(a3)


@njit(cache=True, fastmath=True, parallel=True)
def matmul_small_q8_0(w, wi8, tab, xs, out):
    n4 = xs.shape[0] // 4 * 4
    for r in prange(w.shape[0]):
        for t0 in range(0, n4, 4):
            _dot4_q8_0(w, wi8, r, tab, xs, t0, out)
        for t in range(n4, xs.shape[0]):
            out[t, r] = _dot_q8_0(w, wi8, r, tab, xs[t])


@njit(cache=True, fastmath=True, parallel=True)
def matmul_small_q4_0(w, wi8, tab, xs, out):
    for r in prange(w.shape[0]):
        for t in range(xs.shape[0]):
            out[t, r] = _dot_q4(w, r, tab, xs[t], 18, False)


@njit(cache=True, fastmath=True, parallel=True)
def matmul_small_q4_1(w, wi8, tab, xs, out):
    for r in prange(w.shape[0]):
        for t in range(xs.shape[0]):
            out[t, r] = _dot_q4(w, r, tab, xs[t], 20, True)


@njit(cache=True, fastmath=True, parallel=True)
def matmul_small_q5_0(w, wi8, tab, xs, out):
    for r in prange(w.shape[0]):
        for t in range(xs.shape[0]):
            out[t, r] = _dot_q5(w, r, tab, xs[t], 22, False)


@njit(cache=True, fastmath=True, parallel=True)
def matmul_small_q5_1(w, wi8, tab, xs, out):
    for r in prange(w.shape[0]):
        for t in range(xs.shape[0]):
            out[t, r] = _dot_q5(w, r, tab, xs[t], 24, True)


@njit(cache=True, fastmath=True, parallel=True)
def matmul_small_q4_k(w, wi8, tab, xs, out):
    for r in prange(w.shape[0]):
        for t in range(xs.shape[0]):
            out[t, r] = _dot_q4_k(w, r, tab, xs[t])


@njit(cache=True, fastmath=True, parallel=True)
def matmul_small_q6_k(w, wi8, tab, xs, out):
    for r in prange(w.shape[0]):
        for t in range(xs.shape[0]):
            out[t, r] = _dot_q6_k(w, wi8, r, tab, xs[t])


@njit(cache=True, fastmath=True, parallel=True)
def matmul_small_generic(qtype, block_size, type_size, w, wi8, tab, xs, out):
    """F16, BF16, Q5_K: a block dequantized at a time, then multiply-accumulated."""
    for r in prange(w.shape[0]):
        buf = np.empty(block_size, dtype=np.float32)
        for t in range(xs.shape[0]):
            out[t, r] = _dot_generic(qtype, w, wi8, r, tab, xs[t], buf, type_size, block_size)


MATVEC: dict[int, Kernel] = {T_Q8_0: matvec_q8_0, T_Q4_0: matvec_q4_0, T_Q4_1: matvec_q4_1, T_Q5_0: matvec_q5_0,
                             T_Q5_1: matvec_q5_1, T_Q4_K: matvec_q4_k, T_Q6_K: matvec_q6_k}

MATMUL_SMALL: dict[int, Kernel] = {T_Q8_0: matmul_small_q8_0, T_Q4_0: matmul_small_q4_0, T_Q4_1: matmul_small_q4_1,
                                   T_Q5_0: matmul_small_q5_0, T_Q5_1: matmul_small_q5_1, T_Q4_K: matmul_small_q4_k,
                                   T_Q6_K: matmul_small_q6_k}
