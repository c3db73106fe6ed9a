"""Q4_K and Q6_K quantizers (numba), writing the block layouts drawn in reference.py.

Simple min/max rounding, not llama.cpp's iterative scale search: every block is valid (gguf-py and
our kernels dequantize it), with a slightly larger error than llama.cpp's quantizer. Scales that are
stored as f16 are rounded first (numpy, which has f16) and the weights are then quantized against
the rounded values, so dequantization reproduces what was chosen.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from numpy.typing import NDArray

from larql.errors import QuantError
from larql.quant.tensor import QuantMatrix
from larql.quant.types import GGMLType


@njit(cache=True, parallel=True)
def _q4k_subblock_ranges(x, scale, minus_min):  # pragma: no cover - numba
    """Per 32-weight sub-block: scale = (max - min) / 15 and -min, with min clamped to <= 0."""
    for s in prange(x.shape[0]):
        lo, hi = np.float32(0.0), x[s, 0]
        for i in range(32):
            lo = min(lo, x[s, i])
            hi = max(hi, x[s, i])
        scale[s] = (hi - lo) / np.float32(15.0)
        minus_min[s] = -lo


@njit(cache=True, parallel=True)
def _q4k_pack(x, d, dmin, sc, mn, out):  # pragma: no cover - numba
    """x `(n_blocks, 256)`, d/dmin f16-rounded `(n_blocks,)`, sc/mn 6-bit `(n_blocks, 8)` -> out `(n_blocks, 144)`."""
    for b in prange(x.shape[0]):
        for s in range(4):  # scales: see the 12-byte diagram in reference.py
            out[b, 4 + s] = (sc[b, s] & 63) | ((sc[b, s + 4] >> 4) << 6)
            out[b, 8 + s] = (mn[b, s] & 63) | ((mn[b, s + 4] >> 4) << 6)
            out[b, 12 + s] = (sc[b, s + 4] & 15) | ((mn[b, s + 4] & 15) << 4)
        for s in range(8):
            scale = d[b] * np.float32(sc[b, s])
            shift = dmin[b] * np.float32(mn[b, s])
            inv = np.float32(1.0) / scale if scale > 0 else np.float32(0.0)
            for i in range(32):
                q = int(np.rint((x[b, 32 * s + i] + shift) * inv))
                q = min(15, max(0, q))
                byte = 16 + 32 * (s // 2) + i
                if s % 2 == 0:
                    out[b, byte] = q
                else:
                    out[b, byte] |= q << 4


@njit(cache=True, parallel=True)
def _q6k_pack(x, d, sc, out):  # pragma: no cover - numba
    """x `(n_blocks, 256)`, d f16-rounded, sc int8 `(n_blocks, 16)` -> out `(n_blocks, 210)`."""
    for b in prange(x.shape[0]):
        for g in range(16):
            out[b, 192 + g] = np.uint8(sc[b, g] & 0xFF)
        for e in range(256):
            scale = d[b] * np.float32(sc[b, e // 16])
            q = int(np.rint(x[b, e] / scale)) if scale != 0 else 0
            q = min(31, max(-32, q)) + 32
            h, t, c = e // 128, (e % 128) // 32, e % 32
            out[b, 64 * h + 32 * (t % 2) + c] |= (q & 15) << (4 * (t // 2))
            out[b, 128 + 32 * h + c] |= (q >> 4) << (2 * t)


def _f16_round(v: NDArray[np.float32]) -> tuple[NDArray[np.float32], NDArray[np.uint8]]:
    half = v.astype(np.float16)
    return half.astype(np.float32), half.view(np.uint8).reshape(-1, 2)


def _blocks(w: NDArray[np.floating], name: str) -> NDArray[np.float32]:
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % 256:
        raise QuantError(f"{name}: K-quants need rows of a multiple of 256 weights, got shape {list(w.shape)}")
    if not np.isfinite(w).all():
        raise QuantError(f"{name}: cannot quantize non-finite weights")
    return w.reshape(-1, 256)


def quantize_q4_k(w: NDArray[np.floating], name: str = "tensor") -> QuantMatrix:
    """Float weights `[rows, cols]` (cols % 256 == 0) -> a Q4_K QuantMatrix."""
    x = _blocks(w, name)
    n = x.shape[0]
    scale, minus_min = np.empty(n * 8, np.float32), np.empty(n * 8, np.float32)
    _q4k_subblock_ranges(x.reshape(-1, 32), scale, minus_min)
    scale, minus_min = scale.reshape(n, 8), minus_min.reshape(n, 8)
    d, d_bytes = _f16_round(scale.max(axis=1) / np.float32(63.0))
    dmin, dmin_bytes = _f16_round(minus_min.max(axis=1) / np.float32(63.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 63).astype(np.int64)
        mn = np.where(dmin[:, None] > 0, np.rint(minus_min / dmin[:, None]), 0).clip(0, 63).astype(np.int64)
    out = np.zeros((n, 144), dtype=np.uint8)
    out[:, 0:2], out[:, 2:4] = d_bytes, dmin_bytes
    _q4k_pack(x, d, dmin, sc, mn, out)
    return QuantMatrix(name, GGMLType.Q4_K, w.shape[0], w.shape[1], out.reshape(w.shape[0], -1))


def quantize_q6_k(w: NDArray[np.floating], name: str = "tensor") -> QuantMatrix:
    """Float weights `[rows, cols]` (cols % 256 == 0) -> a Q6_K QuantMatrix."""
    x = _blocks(w, name)
    n = x.shape[0]
    groups = x.reshape(n, 16, 16)
    at = np.abs(groups).argmax(axis=2)[..., None]
    # signed scale (as llama.cpp): the largest-magnitude weight maps to q = -32, the one code the
    # asymmetric range -32..31 always has, so it is represented exactly whatever its sign
    group_scale = np.take_along_axis(groups, at, axis=2)[..., 0] / np.float32(-32.0)  # (n, 16)
    d, d_bytes = _f16_round(np.abs(group_scale).max(axis=1) / np.float32(127.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(group_scale / d[:, None]), 0).clip(-128, 127).astype(np.int64)
    out = np.zeros((n, 210), dtype=np.uint8)
    out[:, 208:210] = d_bytes
    _q6k_pack(x, d, sc, out)
    return QuantMatrix(name, GGMLType.Q6_K, w.shape[0], w.shape[1], out.reshape(w.shape[0], -1))
