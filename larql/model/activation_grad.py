"""act(g) and act'(g) in one pass over the gate scores, for the hand-written backward (grad.py).

numpy spent ~45 ms on a value step's (1090, 2048) gate scores (a dozen passes, tanh in float32): half
of each MLP block of the tail. One numba pass takes ~14 ms — on one thread: on both cores it took 7 ms
alone but numba's workers, spinning after the parallel loop, slowed the BLAS calls around it. tanh is written with exp (tanh u = sign(u) (1 - e) / (1 + e), e = exp(-2|u|)), which
numba inlines: within ~1e-6 of numpy's (test); fast-math without the no-NaN/no-Inf assumptions, so
a gate far below 0 (an inserted neuron's) still gives exp overflow -> 0 as it should.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.typing import NDArray

F32 = NDArray[np.float32]
_FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}
_C = np.float32(np.sqrt(2.0 / np.pi))
_CHUNK = 4096


@njit(cache=True, fastmath=_FAST)
def _act_and_grad(g, a, da, silu):
    n = g.shape[0]
    for b in range((n + _CHUNK - 1) // _CHUNK):
        for i in range(b * _CHUNK, min(n, (b + 1) * _CHUNK)):
            x = g[i]
            if silu:
                s = np.float32(1.0) / (np.float32(1.0) + np.exp(-x))
                a[i] = x * s
                da[i] = s * (np.float32(1.0) + x * (np.float32(1.0) - s))
                continue
            u = _C * (x + np.float32(0.044715) * x * x * x)
            e = np.exp(np.float32(-2.0) * np.abs(u))
            t = (np.float32(1.0) - e) / (np.float32(1.0) + e)
            if u < 0:
                t = -t
            a[i] = np.float32(0.5) * x * (np.float32(1.0) + t)
            da[i] = (np.float32(0.5) * (np.float32(1.0) + t) + np.float32(0.5) * x * (np.float32(1.0) - t * t)
                     * _C * (np.float32(1.0) + np.float32(3 * 0.044715) * x * x))


def act_and_grad(kind: str, g: F32) -> tuple[F32, F32]:
    """act(g) and act'(g), float32 of g's shape, for "gelu_tanh" or "silu"."""
    flat = np.ascontiguousarray(g, dtype=np.float32).reshape(-1)
    a, da = np.empty_like(flat), np.empty_like(flat)
    _act_and_grad(flat, a, da, kind != "gelu_tanh")
    return a.reshape(g.shape), da.reshape(g.shape)
