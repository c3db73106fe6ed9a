"""Numba kernels over raw GGUF blocks: exact dequantization, fused matvec, small-batch matmul.

Kernels take only contiguous arrays and scalars (house rule) and are compiled with cache=True.
The block layouts are drawn in `reference.py` next to the numpy definitions; the index arithmetic
here follows those diagrams. Every kernel receives the weight bytes twice, as uint8 and as int8
views of the same memory (Q8_0 weights and Q6_K scales are signed), and a 65,536-entry table that
turns a 16-bit float (f16, or bf16 for BF16 tensors) into its exact float32 value.

`dequantize_rows` is exact: no fastmath, so each product rounds as in the numpy reference and
LLVM does not contract `a * b - c` into an FMA. The dot-product kernels use fastmath: they only
have to agree with float32 matmul over the dequantized weights within rounding.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from larql.quant.types import GGMLType

F16_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
BF16_TO_F32 = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)

T_F32 = int(GGMLType.F32)
T_F16 = int(GGMLType.F16)
T_BF16 = int(GGMLType.BF16)
T_Q4_0 = int(GGMLType.Q4_0)
T_Q4_1 = int(GGMLType.Q4_1)
T_Q5_0 = int(GGMLType.Q5_0)
T_Q5_1 = int(GGMLType.Q5_1)
T_Q8_0 = int(GGMLType.Q8_0)
T_Q4_K = int(GGMLType.Q4_K)
T_Q5_K = int(GGMLType.Q5_K)
T_Q6_K = int(GGMLType.Q6_K)


@njit(cache=True, inline="always")
def _u16(w, i):  # little-endian 16-bit word at byte i
    return np.int64(w[i]) | (np.int64(w[i + 1]) << 8)


@njit(cache=True, inline="always")
def _u32(w, i):  # little-endian 32-bit word at byte i
    return (np.int64(w[i]) | (np.int64(w[i + 1]) << 8)
            | (np.int64(w[i + 2]) << 16) | (np.int64(w[i + 3]) << 24))


@njit(cache=True, inline="always")
def _k_scale_min(w, b, s):
    """6-bit (scale, min) of sub-block s from the 12 scale bytes at b (diagram in reference.py)."""
    if s < 4:
        return np.int64(w[b + s] & 63), np.int64(w[b + 4 + s] & 63)
    sc = (w[b + 4 + s] & 15) | ((w[b + s - 4] >> 6) << 4)
    mn = (w[b + 4 + s] >> 4) | ((w[b + s] >> 6) << 4)
    return np.int64(sc), np.int64(mn)


@njit(cache=True)
def _dequant_block(qtype, w, wi8, b, tab, out, o):
    """Write the weights of the block starting at byte b of row `w` to out[o:o+block_size]."""
    f32 = np.float32
    if qtype == T_F16 or qtype == T_BF16:
        out[o] = tab[_u16(w, b)]
    elif qtype == T_Q8_0:
        d = tab[_u16(w, b)]
        for i in range(32):
            out[o + i] = f32(wi8[b + 2 + i]) * d
    elif qtype == T_Q4_0 or qtype == T_Q4_1:
        d = tab[_u16(w, b)]
        m = tab[_u16(w, b + 2)] if qtype == T_Q4_1 else f32(0.0)
        qs = b + 2 if qtype == T_Q4_0 else b + 4
        for j in range(16):
            lo, hi = np.int64(w[qs + j] & 15), np.int64(w[qs + j] >> 4)
            if qtype == T_Q4_0:
                out[o + j] = d * f32(lo - 8)
                out[o + j + 16] = d * f32(hi - 8)
            else:
                out[o + j] = d * f32(lo) + m
                out[o + j + 16] = d * f32(hi) + m
    elif qtype == T_Q5_0 or qtype == T_Q5_1:
        d = tab[_u16(w, b)]
        m = tab[_u16(w, b + 2)] if qtype == T_Q5_1 else f32(0.0)
        hb = b + 2 if qtype == T_Q5_0 else b + 4
        qh = _u32(w, hb)
        for j in range(16):
            lo = np.int64(w[hb + 4 + j] & 15) | (((qh >> j) & 1) << 4)
            hi = np.int64(w[hb + 4 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)
            if qtype == T_Q5_0:
                out[o + j] = d * f32(lo - 16)
                out[o + j + 16] = d * f32(hi - 16)
            else:
                out[o + j] = d * f32(lo) + m
                out[o + j + 16] = d * f32(hi) + m
    elif qtype == T_Q4_K or qtype == T_Q5_K:
        d, dmin = tab[_u16(w, b)], tab[_u16(w, b + 2)]
        qs = b + 16 if qtype == T_Q4_K else b + 48
        for s in range(8):
            sc, mn = _k_scale_min(w, b + 4, s)
            scale, shift = d * f32(sc), dmin * f32(mn)
            shift_bits = 4 * (s % 2)
            for i in range(32):
                q = np.int64((w[qs + 32 * (s // 2) + i] >> shift_bits) & 15)
                if qtype == T_Q5_K:
                    q |= np.int64((w[b + 16 + i] >> s) & 1) << 4
                out[o + 32 * s + i] = scale * f32(q) - shift
    elif qtype == T_Q6_K:
        d = tab[_u16(w, b + 208)]
        for e in range(256):
            h, t, c = e // 128, (e % 128) // 32, e % 32
            lo = (w[b + 64 * h + 32 * (t % 2) + c] >> (4 * (t // 2))) & 15
            hi = (w[b + 128 + 32 * h + c] >> (2 * t)) & 3
            q = np.int64(lo | (hi << 4)) - 32
            out[o + e] = (d * f32(wi8[b + 192 + e // 16])) * f32(q)


@njit(cache=True, parallel=True)
def dequantize_rows(qtype, block_size, type_size, w, wi8, tab, out):
    """Exact dequantization: w uint8 `[n, row_bytes]` -> out float32 `[n, n_cols]`."""
    n_rows, n_blocks = w.shape[0], w.shape[1] // type_size
    for r in prange(n_rows):
        for k in range(n_blocks):
            _dequant_block(qtype, w[r], wi8[r], k * type_size, tab, out[r], k * block_size)


@njit(cache=True, fastmath=True, inline="always")
def _row_dot(qtype, w, wi8, tab, x, xsum, buf, type_size, block_size):
    """dot(dequantized row, x). xsum[g] = sum of x over the g-th 32-weight group (for the min terms)."""
    n_blocks = w.shape[0] // type_size
    total = np.float32(0.0)
    if qtype == T_Q8_0:
        for k in range(n_blocks):
            b, xo = k * 34, k * 32
            acc = np.float32(0.0)
            for i in range(32):
                acc += np.float32(wi8[b + 2 + i]) * x[xo + i]
            total += tab[_u16(w, b)] * acc
    elif qtype == T_Q4_0 or qtype == T_Q4_1:
        off = 2 if qtype == T_Q4_0 else 4
        for k in range(n_blocks):
            b, xo = k * type_size, k * 32
            acc = np.float32(0.0)
            for j in range(16):
                byte = w[b + off + j]
                acc += np.float32(byte & 15) * x[xo + j] + np.float32(byte >> 4) * x[xo + j + 16]
            if qtype == T_Q4_0:
                total += tab[_u16(w, b)] * (acc - 8.0 * xsum[k])
            else:
                total += tab[_u16(w, b)] * acc + tab[_u16(w, b + 2)] * xsum[k]
    elif qtype == T_Q5_0 or qtype == T_Q5_1:
        hb = 2 if qtype == T_Q5_0 else 4
        for k in range(n_blocks):
            b, xo = k * type_size, k * 32
            qh = _u32(w, b + hb)
            acc = np.float32(0.0)
            for j in range(16):
                byte = np.int64(w[b + hb + 4 + j])
                lo = (byte & 15) | (((qh >> j) & 1) << 4)
                hi = (byte >> 4) | (((qh >> (j + 16)) & 1) << 4)
                acc += np.float32(lo) * x[xo + j] + np.float32(hi) * x[xo + j + 16]
            if qtype == T_Q5_0:
                total += tab[_u16(w, b)] * (acc - 16.0 * xsum[k])
            else:
                total += tab[_u16(w, b)] * acc + tab[_u16(w, b + 2)] * xsum[k]
    elif qtype == T_Q4_K:
        for k in range(n_blocks):
            b, xo = k * 144, k * 256
            d, dmin = tab[_u16(w, b)], tab[_u16(w, b + 2)]
            for c in range(4):  # 32-byte chunk c holds sub-blocks 2c (low) and 2c+1 (high)
                lo_acc = np.float32(0.0)
                hi_acc = np.float32(0.0)
                for i in range(32):
                    byte = w[b + 16 + 32 * c + i]
                    lo_acc += np.float32(byte & 15) * x[xo + 64 * c + i]
                    hi_acc += np.float32(byte >> 4) * x[xo + 64 * c + 32 + i]
                sc0, mn0 = _k_scale_min(w, b + 4, 2 * c)
                sc1, mn1 = _k_scale_min(w, b + 4, 2 * c + 1)
                total += d * (np.float32(sc0) * lo_acc + np.float32(sc1) * hi_acc)
                total -= dmin * (np.float32(mn0) * xsum[8 * k + 2 * c] + np.float32(mn1) * xsum[8 * k + 2 * c + 1])
    elif qtype == T_Q6_K:
        for k in range(n_blocks):
            b, xo = k * 210, k * 256
            d = tab[_u16(w, b + 208)]
            for h in range(2):
                for t in range(4):
                    acc0 = np.float32(0.0)
                    acc1 = np.float32(0.0)
                    for c in range(32):
                        lo = (w[b + 64 * h + 32 * (t % 2) + c] >> (4 * (t // 2))) & 15
                        hi = (w[b + 128 + 32 * h + c] >> (2 * t)) & 3
                        q = np.float32(np.int32(lo | (hi << 4)) - 32)
                        if c < 16:
                            acc0 += q * x[xo + 128 * h + 32 * t + c]
                        else:
                            acc1 += q * x[xo + 128 * h + 32 * t + c]
                    g = 8 * h + 2 * t
                    total += d * (np.float32(wi8[b + 192 + g]) * acc0 + np.float32(wi8[b + 193 + g]) * acc1)
    else:  # F16, BF16, Q5_K: dequantize a block at a time, then dot
        for k in range(n_blocks):
            _dequant_block(qtype, w, wi8, k * type_size, tab, buf, 0)
            xo = k * block_size
            acc = np.float32(0.0)
            for i in range(block_size):
                acc += buf[i] * x[xo + i]
            total += acc
    return total


@njit(cache=True, fastmath=True)
def _group_sums(x):
    """Sums of x over consecutive 32-element groups (the min/offset terms of Q4_1, Q5_*, Q4_K)."""
    n = x.shape[0] // 32
    out = np.empty(n, dtype=np.float32)
    for g in range(n):
        s = np.float32(0.0)
        for i in range(32):
            s += x[32 * g + i]
        out[g] = s
    return out


@njit(cache=True, fastmath=True, parallel=True)
def matvec(qtype, block_size, type_size, w, wi8, tab, x, out):
    """out[r] = dot(dequantized w[r], x) for every row r; w uint8 `[n, row_bytes]`, x float32 `[k]`."""
    n_rows = w.shape[0]
    xsum = _group_sums(x) if x.shape[0] % 32 == 0 else np.zeros(1, dtype=np.float32)
    n_chunks = min(n_rows, 64)
    for ch in prange(n_chunks):
        buf = np.empty(block_size, dtype=np.float32)
        for r in range(ch * n_rows // n_chunks, (ch + 1) * n_rows // n_chunks):
            out[r] = _row_dot(qtype, w[r], wi8[r], tab, x, xsum, buf, type_size, block_size)


@njit(cache=True, fastmath=True, parallel=True)
def matmul_small(qtype, block_size, type_size, w, wi8, tab, xs, out):
    """out[t, r] = dot(dequantized w[r], xs[t]) for a few rows of activations xs `[t, k]`.

    Each weight row is dequantized once into a buffer and reused for every t, so the weights are
    read from memory once however many tokens there are.
    """
    n_rows, n_cols, n_tok = w.shape[0], xs.shape[1], xs.shape[0]
    n_blocks = w.shape[1] // type_size
    n_chunks = min(n_rows, 64)
    for ch in prange(n_chunks):
        row = np.empty(n_cols, dtype=np.float32)
        for r in range(ch * n_rows // n_chunks, (ch + 1) * n_rows // n_chunks):
            for k in range(n_blocks):
                _dequant_block(qtype, w[r], wi8[r], k * type_size, tab, row, k * block_size)
            for t in range(n_tok):
                acc = np.float32(0.0)
                for i in range(n_cols):
                    acc += row[i] * xs[t, i]
                out[t, r] = acc
