"""Exact dequantization of the common types' GGUF blocks to float32 rows, for the prefill path
(dequantize a chunk of a weight, then BLAS) and whole-matrix copies: the same float operations as
`kernels.dequant_block`, bit for bit (test), in loops LLVM turns into vector code, 3-6x faster on one
thread than the integer loops they replace on gemma3-270m's matrices (12x for Q4_0 and Q5_K, which
had only the generic kernel). What keeps them in vector registers:
- The inner loops run to a count passed in first (`n16`, `n32`), not a constant: LLVM unrolls a loop of a
  constant 16 or 32 fully and then converts its integers one by one; an unknown count is vectorized.
- The 4-bit and 1-bit fields come out of each byte in float32 arithmetic: numba widens integer
  arithmetic on bytes to int64 (eight lanes a register, not sixteen). A byte's value as float32 and
  hi = floor(v / 16), lo = v - 16 hi are exact, so the weights round as the integer version's do.
- Both nibbles of a byte are written in one pass (two outputs per load), never a shift by a
  variable count per sub-block.
Q6_K is the exception: its integer loop of 32, one weight a pass, vectorizes and was the fastest.

Serial and `nogil`: callers around BLAS run them on one thread (numba's OpenMP workers spin and would
take BLAS's cores, docs/design/cpu-paths.md). Kernels take (w uint8 `[n, row_bytes]`, wi8 the same
bytes as int8, the f16 table, out float32 `[n, n_cols]`), as `QuantMatrix._args(...)[3:]`;
`DEQUANTIZE` binds the counts.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
from numba import njit
from numpy.typing import NDArray

from larql.quant.kernels import BIT, T_Q4_0, T_Q4_1, T_Q4_K, T_Q5_0, T_Q5_K, T_Q6_K, T_Q8_0, k_scale_min, u16r, u32r

F32 = np.float32


@njit(cache=True, inline="always")
def _nibbles(byte):  # type: ignore[no-untyped-def]
    """(low, high) 4-bit halves of a byte's value v (a float32 integer 0..255), exactly."""
    hi = np.floor(byte * F32(0.0625))
    return byte - F32(16.0) * hi, hi


@njit(cache=True, inline="always")
def _bits_1_0(h):  # type: ignore[no-untyped-def]
    """(bit 1, bit 0) of a float32 integer h >= 0."""
    h2 = np.floor(h * F32(0.5))
    h4 = np.floor(h * F32(0.25))
    return h2 - F32(2.0) * h4, h - F32(2.0) * h2


@njit(cache=True, nogil=True)
def dequantize_q8_0(n32, w, wi8, tab, out):  # type: ignore[no-untyped-def]
    """Q8_0: w = d * q, q int8 (34-byte blocks: d f16 | 32 qs)."""
    for r in range(w.shape[0]):
        for k in range(w.shape[1] // 34):
            d = tab[u16r(w, r, 34 * k)]
            for i in range(n32):
                out[r, 32 * k + i] = F32(wi8[r, 34 * k + 2 + i]) * d


@njit(cache=True, nogil=True)
def dequantize_q4_0(n16, w, wi8, tab, out):  # type: ignore[no-untyped-def]
    """Q4_0: w = d * (q - 8) (18-byte blocks: d | 16 qs, weight j in qs[j]'s low nibble, j + 16 high)."""
    for r in range(w.shape[0]):
        for k in range(w.shape[1] // 18):
            b, o = 18 * k, 32 * k
            d = tab[u16r(w, r, b)]
            for j in range(n16):
                lo, hi = _nibbles(F32(w[r, b + 2 + j]))
                out[r, o + j] = d * (lo - F32(8.0))
                out[r, o + 16 + j] = d * (hi - F32(8.0))


@njit(cache=True, nogil=True)
def dequantize_q4_1(n16, w, wi8, tab, out):  # type: ignore[no-untyped-def]
    """Q4_1: w = d * q + m (20-byte blocks: d | m | 16 qs as Q4_0's)."""
    for r in range(w.shape[0]):
        for k in range(w.shape[1] // 20):
            b, o = 20 * k, 32 * k
            d, m = tab[u16r(w, r, b)], tab[u16r(w, r, b + 2)]
            for j in range(n16):
                lo, hi = _nibbles(F32(w[r, b + 4 + j]))
                out[r, o + j] = d * lo + m
                out[r, o + 16 + j] = d * hi + m


@njit(cache=True, nogil=True)
def dequantize_q5_0(n16, w, wi8, tab, out):  # type: ignore[no-untyped-def]
    """Q5_0: w = d * (q - 16), the fifth bit of weight j bit j of the u32 qh (22-byte blocks: d | qh | 16 qs)."""
    for r in range(w.shape[0]):
        for k in range(w.shape[1] // 22):
            b, o = 22 * k, 32 * k
            d = tab[u16r(w, r, b)]
            qh = np.uint32(u32r(w, r, b + 2))
            for j in range(n16):
                lo, hi = _nibbles(F32(w[r, b + 6 + j]))
                lo += F32(16.0) if qh & BIT[j] else F32(0.0)
                hi += F32(16.0) if qh & BIT[16 + j] else F32(0.0)
                out[r, o + j] = d * (lo - F32(16.0))
                out[r, o + 16 + j] = d * (hi - F32(16.0))


@njit(cache=True, nogil=True)
def dequantize_q4_k(n32, w, wi8, tab, out):  # type: ignore[no-untyped-def]
    """Q4_K: w = (d sc_s) q - dmin m_s per sub-block s of 32 (144-byte blocks: d | dmin | 12 scale bytes |
    128 qs); qs chunk p holds sub-block 2p in its low nibbles and 2p + 1 in its high ones."""
    for r in range(w.shape[0]):
        for k in range(w.shape[1] // 144):
            b, o = 144 * k, 256 * k
            d, dmin = tab[u16r(w, r, b)], tab[u16r(w, r, b + 2)]
            for p in range(4):
                sc, mn = k_scale_min(w[r], b + 4, 2 * p)
                s0, m0 = d * F32(sc), dmin * F32(mn)
                sc, mn = k_scale_min(w[r], b + 4, 2 * p + 1)
                s1, m1 = d * F32(sc), dmin * F32(mn)
                for i in range(n32):
                    lo, hi = _nibbles(F32(w[r, b + 16 + 32 * p + i]))
                    out[r, o + 64 * p + i] = s0 * lo - m0
                    out[r, o + 64 * p + 32 + i] = s1 * hi - m1


@njit(cache=True, nogil=True)
def dequantize_q5_k(n32, w, wi8, tab, out):  # type: ignore[no-untyped-def]
    """Q5_K: Q4_K's sums with a fifth bit, bit s of qh[i] for weight 32s + i (176-byte blocks: d | dmin |
    12 scale bytes | 32 qh | 128 qs)."""
    for r in range(w.shape[0]):
        for k in range(w.shape[1] // 176):
            b, o = 176 * k, 256 * k
            d, dmin = tab[u16r(w, r, b)], tab[u16r(w, r, b + 2)]
            for p in range(4):
                sc, mn = k_scale_min(w[r], b + 4, 2 * p)
                s0, m0 = d * F32(sc), dmin * F32(mn)
                sc, mn = k_scale_min(w[r], b + 4, 2 * p + 1)
                s1, m1 = d * F32(sc), dmin * F32(mn)
                step = F32(1.0) / F32(1 << (2 * p))
                for i in range(n32):
                    lo, hi = _nibbles(F32(w[r, b + 48 + 32 * p + i]))
                    h1, h0 = _bits_1_0(np.floor(F32(w[r, b + 16 + i]) * step))  # bits 2p + 1, 2p of qh[i]
                    out[r, o + 64 * p + i] = s0 * (lo + F32(16.0) * h0) - m0
                    out[r, o + 64 * p + 32 + i] = s1 * (hi + F32(16.0) * h1) - m1


@njit(cache=True, nogil=True)
def dequantize_q6_k(w, wi8, tab, out):  # type: ignore[no-untyped-def]
    """Q6_K: w = (d sc_j) (q - 32) per group j of 16, q = low 4 bits | high 2 bits << 4 (diagram in
    reference.py), 32 weights a pass, each half of them taking its group's scale (a blend, which
    vectorizes). Integer unpacking with a constant count here: 25% faster than the float32 form
    of the other kernels, whose Q6_K needs five floors per four weights."""
    for r in range(w.shape[0]):
        for k in range(w.shape[1] // 210):
            b, o = 210 * k, 256 * k
            d = tab[u16r(w, r, b + 208)]
            for g in range(8):
                h, t = g // 4, g % 4
                lo0, lo_sh = b + 64 * h + 32 * (t % 2), 4 * (t // 2)
                hi0, hi_sh = b + 128 + 32 * h, 2 * t
                s0, s1 = d * F32(wi8[r, b + 192 + 2 * g]), d * F32(wi8[r, b + 192 + 2 * g + 1])
                for c in range(32):
                    q = np.int32(((w[r, lo0 + c] >> lo_sh) & 15) | (((w[r, hi0 + c] >> hi_sh) & 3) << 4)) - 32
                    out[r, o + 32 * g + c] = (s0 if c < 16 else s1) * F32(q)


Kernel = Callable[[NDArray[np.uint8], NDArray[np.int8], NDArray[np.float32], NDArray[np.float32]], None]

DEQUANTIZE: dict[int, Kernel] = {
    T_Q8_0: partial(dequantize_q8_0, 32), T_Q4_0: partial(dequantize_q4_0, 16),
    T_Q4_1: partial(dequantize_q4_1, 16), T_Q5_0: partial(dequantize_q5_0, 16),
    T_Q4_K: partial(dequantize_q4_k, 32), T_Q5_K: partial(dequantize_q5_k, 32), T_Q6_K: dequantize_q6_k,
}
"""The exact dequantizer of each type that has one here: kernel(w, wi8, tab, out)."""

