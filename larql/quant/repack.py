"""Decode-speed repacking: 4/5/6-bit GGUF blocks -> int8 weights with a float32 scale (and offset)
per group of 32 (16 for Q6_K), so a matvec is convert + multiply-add per weight, not bit unpacking.

Every GGML type here is `w = scale * q + offset` with a small integer q and one (scale, offset) per
16 or 32 weights; repacking writes exactly those parts (the products computed as `dequant_block`
computes them), so `scale * q + offset` is bit-identical to the exact dequantization (test). It costs
1.125-1.25 bytes per weight instead of 0.56-0.82, kept in memory, in exchange for kernels that run
1.3-2.9x faster on this AVX-without-AVX2 CPU (benchmarks/bench_runtime.py). Q8_0 is already int8
and is not repacked; F16/BF16/F32 are not quantized.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
from numba import njit, prange
from numpy.typing import NDArray

from larql.quant import matvec_rows
from larql.quant.dot_kernels import lane_sum
from larql.quant.kernels import k_scale_min, u16, u32
from larql.quant.types import GGMLType

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


# One kernel per family of block layouts, so that a model compiles only the families it holds, and
# serial: numba's parallel setup costs more than the work on matrices this size, and parallel
# kernels take several times longer to compile (docs/design/cpu-paths.md). The unpacking is `dequant_block`'s (bit diagrams in reference.py); here the integer and its
# (scale, offset) are written apart instead of multiplied.


@njit(cache=True, nogil=True)
def _repack_legacy(has_min, five, type_size, w, tab, q, scale, offset):
    """Q4_0 / Q4_1 / Q5_0 / Q5_1: 32 weights per block, one (scale, offset) each."""
    for r in prange(w.shape[0]):
        row = w[r]
        for k in range(w.shape[1] // type_size):
            b, o = k * type_size, 32 * k
            scale[r, k] = tab[u16(row, b)]
            offset[r, k] = tab[u16(row, b + 2)] if has_min else np.float32(0.0)
            qs = b + (4 if has_min else 2) + (4 if five else 0)
            qh = u32(row, qs - 4) if five else np.int64(0)
            centre = 0 if has_min else (16 if five else 8)
            for j in range(16):
                lo = np.int64(row[qs + j] & 15) | (((qh >> j) & 1) << 4)
                hi = np.int64(row[qs + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)
                q[r, o + j] = lo - centre
                q[r, o + 16 + j] = hi - centre


@njit(cache=True, nogil=True)
def _repack_k(five, type_size, w, tab, q, scale, offset):
    """Q4_K / Q5_K: 256 weights per block in 8 sub-blocks of 32, each its (scale, -min)."""
    for r in prange(w.shape[0]):
        row = w[r]
        for k in range(w.shape[1] // type_size):
            b, o = k * type_size, 256 * k
            d, dmin = tab[u16(row, b)], tab[u16(row, b + 2)]
            qs = b + 48 if five else b + 16
            for s in range(8):
                sc, mn = k_scale_min(row, b + 4, s)
                scale[r, 8 * k + s] = d * np.float32(sc)
                offset[r, 8 * k + s] = -(dmin * np.float32(mn))
                base, shift = qs + 32 * (s // 2), 4 * (s % 2)
                for i in range(32):
                    v = np.int64((row[base + i] >> shift) & 15)
                    if five:
                        v |= np.int64((row[b + 16 + i] >> s) & 1) << 4
                    q[r, o + 32 * s + i] = v


@njit(cache=True, nogil=True)
def _repack_q6_k(w, wi8, tab, q, scale):
    """Q6_K: 256 weights per block (210 bytes), a signed int8 scale per 16."""
    for r in prange(w.shape[0]):
        row = w[r]
        for k in range(w.shape[1] // 210):
            b, o = 210 * k, 256 * k
            d = tab[u16(row, b + 208)]
            for j in range(16):
                scale[r, 16 * k + j] = d * np.float32(wi8[r, b + 192 + j])
            for h in range(2):
                for t in range(4):
                    lo0, lo_sh = b + 64 * h + 32 * (t % 2), 4 * (t // 2)
                    hi0, hi_sh = b + 128 + 32 * h, 2 * t
                    for c in range(32):
                        lo = (row[lo0 + c] >> lo_sh) & 15
                        hi = (row[hi0 + c] >> hi_sh) & 3
                        q[r, o + 128 * h + 32 * t + c] = np.int64(lo | (hi << 4)) - 32


def repack(qtype: GGMLType, block_size: int, type_size: int, raw: NDArray[np.uint8],
           table: NDArray[np.float32], n_cols: int) -> Repacked:
    """The int8 weights and float32 (scale, offset) of a repackable type's raw rows `[rows, bytes]`."""
    rows = raw.shape[0]
    q = np.empty((rows, n_cols), dtype=np.int8)
    if qtype == GGMLType.Q6_K:
        scale = np.empty((rows, n_cols // 16), dtype=np.float32)
        _repack_q6_k(raw, raw.view(np.int8), table, q, scale)
        return Repacked(q, scale, None, 16)
    scale = np.empty((rows, n_cols // 32), dtype=np.float32)
    offset = np.empty((rows, n_cols // 32), dtype=np.float32)
    if qtype in (GGMLType.Q4_K, GGMLType.Q5_K):
        _repack_k(qtype == GGMLType.Q5_K, type_size, raw, table, q, scale, offset)
    elif qtype in (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1):
        _repack_legacy(qtype in (GGMLType.Q4_1, GGMLType.Q5_1), qtype in (GGMLType.Q5_0, GGMLType.Q5_1),
                       type_size, raw, table, q, scale, offset)
    else:
        raise ValueError(f"{qtype.name} is not repackable")
    return Repacked(q, scale, offset if qtype in HAS_OFFSET else None, 32)


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
    return lane_sum(acc)


@njit(cache=True, fastmath=True, inline="always")
def _dot_g32_offset(q, scale, offset, r, x):
    acc = np.zeros(32, dtype=np.float32)
    for k in range(q.shape[1] // 32):
        s, m = scale[r, k], offset[r, k]
        for i in range(32):
            acc[i] += (np.float32(q[r, 32 * k + i]) * s + m) * x[32 * k + i]
    return lane_sum(acc)


@njit(cache=True, fastmath=True, inline="always")
def _dot_g16(q, scale, r, x):
    acc = np.zeros(32, dtype=np.float32)
    for k in range(q.shape[1] // 32):
        s0, s1 = scale[r, 2 * k], scale[r, 2 * k + 1]
        for i in range(32):
            s = s0 if i < 16 else s1
            acc[i] += (np.float32(q[r, 32 * k + i]) * s) * x[32 * k + i]
    return lane_sum(acc)


# Several rows at once (a batch of sequences, a short prompt): each weight widened and scaled once
# for four rows, most of a dot product's cost; per row the same products and sums as the one-row
# kernels above, so the same bits as those. A decode step's single row goes to matvec_rows' kernel,
# which sums in another order (up to ~4e-7 relative on types with an offset): a batched step
# equals a single one within the tests' 2e-6, not bit for bit.

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
    out[t0, r], out[t0 + 1, r] = lane_sum(a0), lane_sum(a1)
    out[t0 + 2, r], out[t0 + 3, r] = lane_sum(a2), lane_sum(a3)


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
    out[t0, r], out[t0 + 1, r] = lane_sum(a0), lane_sum(a1)
    out[t0 + 2, r], out[t0 + 3, r] = lane_sum(a2), lane_sum(a3)


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
    out[t0, r], out[t0 + 1, r] = lane_sum(a0), lane_sum(a1)
    out[t0 + 2, r], out[t0 + 3, r] = lane_sum(a2), lane_sum(a3)


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



def matvec_kernel(p: Repacked) -> Callable[[NDArray[np.float32], NDArray[np.float32]], None]:
    """matvec_rows' kernel for p's layout, bound to p's parts: kernel(x `[cols]`, out `[rows]`)."""
    if p.group == 16:
        return partial(matvec_rows.matvec_g16, p.q, p.scale)
    if p.offset is None:
        return partial(matvec_rows.matvec_g32, p.q, p.scale)
    return partial(matvec_rows.matvec_g32_offset, p.q, p.scale, p.offset)


def matvec(p: Repacked, x: NDArray[np.float32], out: NDArray[np.float32]) -> None:
    """out `[rows]` = the weights times one activation x `[cols]` (float32, contiguous)."""
    matvec_kernel(p)(x, out)


def matmul(p: Repacked, xs: NDArray[np.float32]) -> NDArray[np.float32]:
    """xs `[t, cols]` (t small) -> `[t, rows]`; one row (a decode step) through matvec_rows.py."""
    out = np.empty((xs.shape[0], p.q.shape[0]), dtype=np.float32)
    if xs.shape[0] == 1:
        matvec(p, xs.reshape(-1), out[0])
        return out
    if p.group == 16:
        matmul_g16(p.q, p.scale, xs, out)
    elif p.offset is None:
        matmul_g32(p.q, p.scale, xs, out)
    else:
        matmul_g32_offset(p.q, p.scale, p.offset, xs, out)
    return out


@njit(cache=True, nogil=True)
def _dequantize_rows(q, scale, offset, group, has_offset, out):
    # no fastmath: `q * scale + offset` must round as the exact dequantization does (no FMA)
    for r in range(q.shape[0]):
        for k in range(scale.shape[1]):
            s = scale[r, k]
            m = offset[r, k] if has_offset else np.float32(0.0)
            if has_offset:
                for i in range(group):
                    out[r, group * k + i] = np.float32(q[r, group * k + i]) * s + m
            else:
                for i in range(group):
                    out[r, group * k + i] = np.float32(q[r, group * k + i]) * s


def dequantize_into(p: Repacked, rows: slice, out: NDArray[np.float32]) -> NDArray[np.float32]:
    """Rows `rows` of the exact weights into `out` `[n, cols]`, bit-identical to dequantizing the GGUF
    blocks (the parts are the blocks' own, test) and faster: no bits to unpack."""
    offset = p.offset if p.offset is not None else p.scale
    _dequantize_rows(p.q[rows], p.scale[rows], offset[rows], p.group, p.offset is not None, out)
    return out
