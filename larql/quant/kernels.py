"""Numba kernels over raw GGUF blocks: their byte readers and exact dequantization.

Kernels take only contiguous arrays and scalars (house rule) and are compiled with cache=True.
The block layouts are drawn in `reference.py` next to the numpy definitions; the index arithmetic
here follows those diagrams. Every kernel receives the weight bytes twice, as uint8 and as int8
views of the same memory (Q8_0 weights and Q6_K scales are signed), and a 65,536-entry table that
turns a 16-bit float (f16, or bf16 for BF16 tensors) into its exact float32 value.

`dequantize_rows` is exact: no fastmath, so each product rounds as in the numpy reference and
LLVM does not contract `a * b - c` into an FMA. The dot-product kernels (`dot_kernels.py`, built
on this module's readers) use fastmath: they only have to agree with float32 matmul over the
dequantized weights within rounding.
"""

from __future__ import annotations

from collections.abc import Callable

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
def u16(w, i):  # little-endian 16-bit word at byte i
    return np.int64(w[i]) | (np.int64(w[i + 1]) << 8)


@njit(cache=True, inline="always")
def u32(w, i):  # little-endian 32-bit word at byte i
    return (np.int64(w[i]) | (np.int64(w[i + 1]) << 8)
            | (np.int64(w[i + 2]) << 16) | (np.int64(w[i + 3]) << 24))


@njit(cache=True, inline="always")
def u16r(w, r, i):  # little-endian 16-bit word at byte i of row r
    return np.int64(w[r, i]) | (np.int64(w[r, i + 1]) << 8)


@njit(cache=True, inline="always")
def u32r(w, r, i):  # little-endian 32-bit word at byte i of row r
    return (np.int64(w[r, i]) | (np.int64(w[r, i + 1]) << 8)
            | (np.int64(w[r, i + 2]) << 16) | (np.int64(w[r, i + 3]) << 24))


# BIT[j] tests the fifth bit of weight j in Q5 blocks: a mask test vectorizes, a per-lane shift
# needs AVX2.
BIT = np.uint32(1) << np.arange(32, dtype=np.uint32)


@njit(cache=True, inline="always")
def k_scale_min(w, b, s):
    """6-bit (scale, min) of sub-block s from the 12 scale bytes at b (diagram in reference.py)."""
    if s < 4:
        return np.int64(w[b + s] & 63), np.int64(w[b + 4 + s] & 63)
    sc = (w[b + 4 + s] & 15) | ((w[b + s - 4] >> 6) << 4)
    mn = (w[b + 4 + s] >> 4) | ((w[b + s] >> 6) << 4)
    return np.int64(sc), np.int64(mn)


@njit(cache=True, inline="always")
def _k_quant(qtype, w, b, qs, s, shift_bits, i):
    """Q4_K / Q5_K: the unsigned integer of weight i of sub-block s (diagram in reference.py)."""
    q = np.int64((w[qs + 32 * (s // 2) + i] >> shift_bits) & 15)
    if qtype == T_Q5_K:
        q |= np.int64((w[b + 16 + i] >> s) & 1) << 4
    return q


@njit(cache=True, inline="always")
def _q6_k_quant(w, b, e):
    """Q6_K: the signed integer (q - 32) of weight e of the block at b (diagram in reference.py)."""
    h, t, c = e // 128, (e % 128) // 32, e % 32
    lo = (w[b + 64 * h + 32 * (t % 2) + c] >> (4 * (t // 2))) & 15
    hi = (w[b + 128 + 32 * h + c] >> (2 * t)) & 3
    return np.int64(lo | (hi << 4)) - 32


@njit(cache=True)
def dequant_block(qtype, w, wi8, b, tab, out, o):
    """Write the weights of the block starting at byte b of row `w` to out[o:o+block_size]."""
    f32 = np.float32
    if qtype == T_F16 or qtype == T_BF16:
        out[o] = tab[u16(w, b)]
    elif qtype == T_Q8_0:
        d = tab[u16(w, b)]
        for i in range(32):
            out[o + i] = f32(wi8[b + 2 + i]) * d
    elif qtype == T_Q4_0 or qtype == T_Q4_1:
        d = tab[u16(w, b)]
        m = tab[u16(w, b + 2)] if qtype == T_Q4_1 else f32(0.0)
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
        d = tab[u16(w, b)]
        m = tab[u16(w, b + 2)] if qtype == T_Q5_1 else f32(0.0)
        hb = b + 2 if qtype == T_Q5_0 else b + 4
        qh = u32(w, hb)
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
        d, dmin = tab[u16(w, b)], tab[u16(w, b + 2)]
        qs = b + 16 if qtype == T_Q4_K else b + 48
        for s in range(8):
            sc, mn = k_scale_min(w, b + 4, s)
            scale, shift = d * f32(sc), dmin * f32(mn)
            shift_bits = 4 * (s % 2)
            for i in range(32):
                out[o + 32 * s + i] = scale * f32(_k_quant(qtype, w, b, qs, s, shift_bits, i)) - shift
    elif qtype == T_Q6_K:
        d = tab[u16(w, b + 208)]
        for e in range(256):
            out[o + e] = (d * f32(wi8[b + 192 + e // 16])) * f32(_q6_k_quant(w, b, e))


@njit(cache=True, parallel=True)
def dequantize_rows(qtype, block_size, type_size, w, wi8, tab, out):
    """Exact dequantization: w uint8 `[n, row_bytes]` -> out float32 `[n, n_cols]`.

    The reference for every type; the common types also have faster serial kernels (dequant_rows.py).
    """
    n_rows, n_blocks = w.shape[0], w.shape[1] // type_size
    for r in prange(n_rows):
        for k in range(n_blocks):
            dequant_block(qtype, w[r], wi8[r], k * type_size, tab, out[r], k * block_size)


# each kernel's own signature (the per-type kernels differ in arity)
Kernel = Callable[..., None]
