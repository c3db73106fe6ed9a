"""The gate KNN's numba kernels (knn.py): int8 rows with their error terms, the bounded int8 pass,
exact rescoring of f16 rows. A module of its own so that opening a vindex loads no numba."""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from numpy.typing import NDArray

_BLOCKS = 64  # row blocks per pass (numba's threads take them in turn)


@njit(cache=True, parallel=True)
def quantize_rows(g: NDArray[np.float32], codes: NDArray[np.int8], scales: NDArray[np.float32],
                   err: NDArray[np.float64], absmax: NDArray[np.float64]) -> None:  # pragma: no cover - numba
    """Each row as codes * scale (scale = max |g| / 127, rounded to nearest); err and absmax in
    float64, where codes * scale and g - codes * scale are exact."""
    n, h = g.shape
    for f in prange(n):
        m = np.float32(0.0)
        for j in range(h):
            m = max(m, abs(g[f, j]))
        sc = m / np.float32(127.0) if m > 0 else np.float32(1.0)
        e, top = 0.0, 0.0
        for j in range(h):
            c = min(127.0, max(-127.0, np.rint(g[f, j] / sc)))
            codes[f, j] = np.int8(c)
            d = np.float64(g[f, j]) - c * np.float64(sc)
            e += d * d
            top = max(top, abs(c) * np.float64(sc))
        scales[f], err[f], absmax[f] = sc, np.sqrt(e) * (1.0 + 1e-12), top  # never below the true norm


@njit(cache=True, parallel=True, fastmath=True)
def int8_bounds(codes: NDArray[np.int8], scales: NDArray[np.float32], err: NDArray[np.float64],
                 absmax: NDArray[np.float64], q: NDArray[np.float32], q_l2: float, slack: float,
                 lo: NDArray[np.float64], hi: NDArray[np.float64]) -> None:  # pragma: no cover - numba
    """lo[f], hi[f]: |approx| -/+ the bound, approx = scales[f] * sum_j codes[f, j] * q[j] (float32,
    summed in any order), bound = err[f] * q_l2 + absmax[f] * slack."""
    n, h = codes.shape
    per = (n + _BLOCKS - 1) // _BLOCKS
    for b in prange(_BLOCKS):
        for f in range(b * per, min(n, (b + 1) * per)):
            s = np.float32(0.0)
            for j in range(h):
                s += np.float32(codes[f, j]) * q[j]
            mag = abs(np.float64(s * scales[f]))
            bound = err[f] * q_l2 + absmax[f] * slack
            lo[f], hi[f] = mag - bound, mag + bound


@njit(cache=True, parallel=True, fastmath=True)
def rescore_f16(bits: NDArray[np.uint16], cand: NDArray[np.int64], q: NDArray[np.float32],
                 out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[i] = gate row cand[i] . q in float32, the f16 row read from its bits (numba has no
    float16): sign and the 15 other bits moved to float32's place read 2^-112 times the value, for
    normal and subnormal halves alike, and 2^112 puts it back exactly."""
    h = bits.shape[1]
    blocks = min(len(cand), 8)
    per = (len(cand) + blocks - 1) // max(blocks, 1)
    for b in prange(blocks):
        buf = np.empty(h, np.uint32)
        fb = buf.view(np.float32)
        for i in range(b * per, min(len(cand), (b + 1) * per)):
            row = bits[cand[i]]
            for j in range(h):
                x = np.uint32(row[j])
                buf[j] = ((x & np.uint32(0x8000)) << np.uint32(16)) | ((x & np.uint32(0x7FFF)) << np.uint32(13))
            s = np.float32(0.0)
            for j in range(h):
                s += (fb[j] * np.float32(2.0 ** 112)) * q[j]
            out[i] = s
