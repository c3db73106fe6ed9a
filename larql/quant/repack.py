"""Decode-speed repacking: 4/5/6-bit GGUF blocks -> int8 weights with a float32 scale (and offset)
per group of 32 (16 for Q6_K), so a matvec is convert + multiply-add per weight, not bit unpacking.

Every GGML type here is `w = scale * q + offset` with a small integer q and one (scale, offset) per
16 or 32 weights; repacking writes exactly those parts (the products computed as `_dequant_block`
computes them), so `scale * q + offset` is bit-identical to the exact dequantization (test). It costs
1.125-1.25 bytes per weight instead of 0.56-0.82, kept in memory, in exchange for kernels that run
1.3-2.9x faster on this AVX-without-AVX2 CPU (benchmarks/bench_runtime.py). Q8_0 is already int8
and is not repacked; F16/BF16/F32 are not quantized.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange
from numpy.typing import NDArray

from larql.quant.kernels import (
    T_Q4_0,
    T_Q4_1,
    T_Q4_K,
    T_Q5_0,
    T_Q5_1,
    T_Q5_K,
    T_Q6_K,
    _k_quant,
    _k_scale_min,
    _lane_sum,
    _q6_k_quant,
    _u16,
    _u32,
)
from larql.quant.types import GGMLType

GROUP = 16  # the unpacking writes a (scale, offset) per 16 weights; types with 32-groups keep every other
REPACKABLE = frozenset({GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
                        GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K})
HAS_OFFSET = frozenset({GGMLType.Q4_1, GGMLType.Q5_1, GGMLType.Q4_K, GGMLType.Q5_K})


@dataclass(frozen=True)
class Repacked:
    """`q` int8 `[rows, cols]`; `scale`, `offset` float32 `[rows, cols // group]` (offset None: zero)."""

    q: NDArray[np.int8]
    scale: NDArray[np.float32]
    offset: NDArray[np.float32] | None
    group: int

    @property
    def nbytes(self) -> int:
        return int(self.q.nbytes + self.scale.nbytes + (0 if self.offset is None else self.offset.nbytes))

    def dequantize(self) -> NDArray[np.float32]:
        s = np.repeat(self.scale, self.group, axis=1)
        w = s * self.q.astype(np.float32)
        return w if self.offset is None else w + np.repeat(self.offset, self.group, axis=1)


@njit(cache=True)
def _repack_block(qtype, w, wi8, b, tab, q, scale, offset, o):
    """The block at byte b of row `w` -> q[o:o+bs], scale/offset[o//16 : (o+bs)//16].

    The unpacking is `_dequant_block`'s (bit diagrams in reference.py); here the integer and its
    (scale, offset) are written apart instead of multiplied.
    """
    f32 = np.float32
    g = o // 16
    if qtype == T_Q4_0 or qtype == T_Q4_1 or qtype == T_Q5_0 or qtype == T_Q5_1:
        d = tab[_u16(w, b)]
        has_min = qtype == T_Q4_1 or qtype == T_Q5_1
        m = tab[_u16(w, b + 2)] if has_min else f32(0.0)
        five = qtype == T_Q5_0 or qtype == T_Q5_1
        qs = b + (4 if has_min else 2) + (4 if five else 0)
        qh = _u32(w, qs - 4) if five else np.int64(0)
        centre = 0 if has_min else (16 if five else 8)
        for j in range(16):
            lo = np.int64(w[qs + j] & 15) | (((qh >> j) & 1) << 4)
            hi = np.int64(w[qs + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)
            q[o + j] = lo - centre
            q[o + 16 + j] = hi - centre
        scale[g] = scale[g + 1] = d
        offset[g] = offset[g + 1] = m
    elif qtype == T_Q4_K or qtype == T_Q5_K:
        d, dmin = tab[_u16(w, b)], tab[_u16(w, b + 2)]
        qs = b + 16 if qtype == T_Q4_K else b + 48
        for s in range(8):
            sc, mn = _k_scale_min(w, b + 4, s)
            scale[g + 2 * s] = scale[g + 2 * s + 1] = d * f32(sc)
            offset[g + 2 * s] = offset[g + 2 * s + 1] = -(dmin * f32(mn))
            shift_bits = 4 * (s % 2)
            for i in range(32):
                q[o + 32 * s + i] = _k_quant(qtype, w, b, qs, s, shift_bits, i)
    elif qtype == T_Q6_K:
        d = tab[_u16(w, b + 208)]
        for e in range(256):
            q[o + e] = _q6_k_quant(w, b, e)
        for k in range(16):
            scale[g + k] = d * f32(wi8[b + 192 + k])
            offset[g + k] = f32(0.0)


@njit(cache=True, parallel=True)
def _repack_rows(qtype, block_size, type_size, w, wi8, tab, q, scale, offset):
    for r in prange(w.shape[0]):
        for k in range(w.shape[1] // type_size):
            _repack_block(qtype, w[r], wi8[r], k * type_size, tab, q[r], scale[r], offset[r], k * block_size)


def repack(qtype: GGMLType, block_size: int, type_size: int, raw: NDArray[np.uint8],
           table: NDArray[np.float32], n_cols: int) -> Repacked:
    rows = raw.shape[0]
    q = np.empty((rows, n_cols), dtype=np.int8)
    scale = np.empty((rows, n_cols // GROUP), dtype=np.float32)
    offset = np.empty((rows, n_cols // GROUP), dtype=np.float32)
    _repack_rows(int(qtype), block_size, type_size, raw, raw.view(np.int8), table, q, scale, offset)
    if qtype == GGMLType.Q6_K:
        return Repacked(q, scale, None, 16)
    return Repacked(q, np.ascontiguousarray(scale[:, ::2]),
                    np.ascontiguousarray(offset[:, ::2]) if qtype in HAS_OFFSET else None, 32)


def nbytes_per_weight(qtype: GGMLType) -> float:
    return 1.0 + (4 / 16 if qtype == GGMLType.Q6_K else (8 if qtype in HAS_OFFSET else 4) / 32)


# The kernels: one 32-lane pass per 32 weights. With 16-groups each lane picks its group's scale
# (a blend, which vectorizes; two 16-wide loops do not, measured 10x slower).


@njit(cache=True, fastmath=True, inline="always")
def _dot_g32(q, scale, r, x):
    acc = np.zeros(32, dtype=np.float32)
    for k in range(q.shape[1] // 32):
        s = scale[r, k]
        for i in range(32):
            acc[i] += (np.float32(q[r, 32 * k + i]) * s) * x[32 * k + i]
    return _lane_sum(acc)


@njit(cache=True, fastmath=True, inline="always")
def _dot_g32_offset(q, scale, offset, r, x):
    acc = np.zeros(32, dtype=np.float32)
    for k in range(q.shape[1] // 32):
        s, m = scale[r, k], offset[r, k]
        for i in range(32):
            acc[i] += (np.float32(q[r, 32 * k + i]) * s + m) * x[32 * k + i]
    return _lane_sum(acc)


@njit(cache=True, fastmath=True, inline="always")
def _dot_g16(q, scale, r, x):
    acc = np.zeros(32, dtype=np.float32)
    for k in range(q.shape[1] // 32):
        s0, s1 = scale[r, 2 * k], scale[r, 2 * k + 1]
        for i in range(32):
            s = s0 if i < 16 else s1
            acc[i] += (np.float32(q[r, 32 * k + i]) * s) * x[32 * k + i]
    return _lane_sum(acc)


# Several rows at once (a batch of sequences, a short prompt): each weight widened and scaled once
# for four rows, most of a dot product's cost; per row the same products and sums as the one-row
# kernels above, so the same bits.

@njit(cache=True, fastmath=True, inline="always")
def _dot4_g32(q, scale, r, xs, t0, out):
    a0, a1 = np.zeros(32, dtype=np.float32), np.zeros(32, dtype=np.float32)
    a2, a3 = np.zeros(32, dtype=np.float32), np.zeros(32, dtype=np.float32)
    x0, x1, x2, x3 = xs[t0], xs[t0 + 1], xs[t0 + 2], xs[t0 + 3]
    for k in range(q.shape[1] // 32):
        s = scale[r, k]
        for i in range(32):
            wv = np.float32(q[r, 32 * k + i]) * s
            a0[i] += wv * x0[32 * k + i]
            a1[i] += wv * x1[32 * k + i]
            a2[i] += wv * x2[32 * k + i]
            a3[i] += wv * x3[32 * k + i]
    out[t0, r], out[t0 + 1, r] = _lane_sum(a0), _lane_sum(a1)
    out[t0 + 2, r], out[t0 + 3, r] = _lane_sum(a2), _lane_sum(a3)


@njit(cache=True, fastmath=True, inline="always")
def _dot4_g32_offset(q, scale, offset, r, xs, t0, out):
    a0, a1 = np.zeros(32, dtype=np.float32), np.zeros(32, dtype=np.float32)
    a2, a3 = np.zeros(32, dtype=np.float32), np.zeros(32, dtype=np.float32)
    x0, x1, x2, x3 = xs[t0], xs[t0 + 1], xs[t0 + 2], xs[t0 + 3]
    for k in range(q.shape[1] // 32):
        s, m = scale[r, k], offset[r, k]
        for i in range(32):
            wv = np.float32(q[r, 32 * k + i]) * s + m
            a0[i] += wv * x0[32 * k + i]
            a1[i] += wv * x1[32 * k + i]
            a2[i] += wv * x2[32 * k + i]
            a3[i] += wv * x3[32 * k + i]
    out[t0, r], out[t0 + 1, r] = _lane_sum(a0), _lane_sum(a1)
    out[t0 + 2, r], out[t0 + 3, r] = _lane_sum(a2), _lane_sum(a3)


@njit(cache=True, fastmath=True, inline="always")
def _dot4_g16(q, scale, r, xs, t0, out):
    a0, a1 = np.zeros(32, dtype=np.float32), np.zeros(32, dtype=np.float32)
    a2, a3 = np.zeros(32, dtype=np.float32), np.zeros(32, dtype=np.float32)
    x0, x1, x2, x3 = xs[t0], xs[t0 + 1], xs[t0 + 2], xs[t0 + 3]
    for k in range(q.shape[1] // 32):
        s0, s1 = scale[r, 2 * k], scale[r, 2 * k + 1]
        for i in range(32):
            wv = np.float32(q[r, 32 * k + i]) * (s0 if i < 16 else s1)
            a0[i] += wv * x0[32 * k + i]
            a1[i] += wv * x1[32 * k + i]
            a2[i] += wv * x2[32 * k + i]
            a3[i] += wv * x3[32 * k + i]
    out[t0, r], out[t0 + 1, r] = _lane_sum(a0), _lane_sum(a1)
    out[t0 + 2, r], out[t0 + 3, r] = _lane_sum(a2), _lane_sum(a3)


@njit(cache=True, fastmath=True, parallel=True)
def matmul_g32(q, scale, xs, out):
    """out[t, r] = dot(scale * q[r], xs[t]) for a few rows of activations xs `[t, cols]`."""
    n4 = xs.shape[0] // 4 * 4
    for r in prange(q.shape[0]):
        for t0 in range(0, n4, 4):
            _dot4_g32(q, scale, r, xs, t0, out)
        for t in range(n4, xs.shape[0]):
            out[t, r] = _dot_g32(q, scale, r, xs[t])


@njit(cache=True, fastmath=True, parallel=True)
def matmul_g32_offset(q, scale, offset, xs, out):
    n4 = xs.shape[0] // 4 * 4
    for r in prange(q.shape[0]):
        for t0 in range(0, n4, 4):
            _dot4_g32_offset(q, scale, offset, r, xs, t0, out)
        for t in range(n4, xs.shape[0]):
            out[t, r] = _dot_g32_offset(q, scale, offset, r, xs[t])


@njit(cache=True, fastmath=True, parallel=True)
def matmul_g16(q, scale, xs, out):
    n4 = xs.shape[0] // 4 * 4
    for r in prange(q.shape[0]):
        for t0 in range(0, n4, 4):
            _dot4_g16(q, scale, r, xs, t0, out)
        for t in range(n4, xs.shape[0]):
            out[t, r] = _dot_g16(q, scale, r, xs[t])



def matmul(p: Repacked, xs: NDArray[np.float32]) -> NDArray[np.float32]:
    """xs `[t, cols]` (t small) -> `[t, rows]`."""
    out = np.empty((xs.shape[0], p.q.shape[0]), dtype=np.float32)
    if p.group == 16:
        matmul_g16(p.q, p.scale, xs, out)
    elif p.offset is None:
        matmul_g32(p.q, p.scale, xs, out)
    else:
        matmul_g32_offset(p.q, p.scale, p.offset, xs, out)
    return out
