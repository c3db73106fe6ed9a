"""Quantizing an activation to Q8_0 as llama.cpp does, and the bound on what that (and float32
rounding) can move a dot product by: the shared ground of the int8 candidate passes (argmax.py,
argmax_tiles.py, topk_tiles.py), whose exactness argument argmax.py's docstring gives.
"""

from __future__ import annotations

import numpy as np
from numba import njit

U = 2.0 ** -24  # float32 unit roundoff


@njit(cache=True)
def quantize_q8(x, xu, dx):
    """Q8_0 of x `[n]` (n % 32 == 0): per 32 values dx = max|x|/127 and q = round(x/dx) in -127..127,
    written as xu = q + 128. Returns (|x̂ - x|, |x̂|) in float64, x̂ = q * dx (the exact products)."""
    err2, hat2 = 0.0, 0.0
    for k in range(x.shape[0] // 32):
        top = np.float32(0.0)
        for i in range(32):
            top = max(top, abs(x[32 * k + i]))
        d = top / np.float32(127.0)
        dx[k] = d
        inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
        for i in range(32):
            q = min(max(np.round(x[32 * k + i] * inv), np.float32(-127.0)), np.float32(127.0))
            xu[32 * k + i] = np.uint8(np.int32(q) + 128)
            hat = np.float64(q) * np.float64(d)
            err2 += (hat - np.float64(x[32 * k + i])) ** 2
            hat2 += hat * hat
    return np.sqrt(err2), np.sqrt(hat2)


def rounding(n: int) -> float:
    """c of the module docstring's bound for activations of n values: 1.01 (n + 2) 2^-24."""
    return 1.01 * (n + 2) * U


@njit(cache=True)
def bound_slack(x, err, hat, c):
    """E_r / |w_r| for the activation x `[n]` (module docstring): |x̂ - x| + c (|x| + |x̂|), err = |x̂ - x|
    and hat = |x̂| from the quantization, |x| in float64, rounded up (every candidate pass's bound)."""
    xn2 = 0.0
    for i in range(x.shape[0]):
        xn2 += np.float64(x[i]) * np.float64(x[i])
    return (err + c * (np.sqrt(xn2) + hat)) * (1 + 1e-9) + 1e-30
