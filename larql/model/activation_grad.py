"""A gated MLP's act(g) * u with what its backward needs, act(g) and act'(g) * u, in one call over the
gate and up scores, for the hand-written backward (grad.py).

The transcendental goes to numpy's SIMD tanh / exp, the polynomial parts to two numba passes that
LLVM vectorises because they call nothing: faster than one numba pass calling a scalar exp per
element, and than numpy's dozen whole-array passes (docs/design/cpu-paths.md). One thread: numba's
workers, spinning after a parallel loop, slowed the BLAS calls around it. A gate far below 0 (an
inserted neuron's) gives exp overflow -> inf -> act 0, as it should.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.typing import NDArray

F32 = NDArray[np.float32]
_FAST = {"nsz", "arcp", "contract", "reassoc"}  # no no-NaN/no-Inf assumption: exp may overflow to inf
_C = np.float32(np.sqrt(2.0 / np.pi))
_K = np.float32(0.044715)


@njit(cache=True, fastmath=_FAST)
def _gelu_inner(g, u):
    for i in range(g.shape[0]):
        x = g[i]
        u[i] = _C * (x + _K * x * x * x)


@njit(cache=True, fastmath=_FAST)
def _gelu_outer(g, u, t, a, ud):
    """t = tanh(inner) in; a = act(g) out, and in t: a * u; ud = act'(g) * u."""
    for i in range(g.shape[0]):
        x, th = g[i], t[i]
        half = np.float32(0.5) * (np.float32(1.0) + th)
        a[i] = x * half
        t[i] = a[i] * u[i]
        ud[i] = u[i] * (half + np.float32(0.5) * x * (np.float32(1.0) - th * th) * _C
                        * (np.float32(1.0) + np.float32(3.0) * _K * x * x))


@njit(cache=True, fastmath=_FAST)
def _silu_outer(g, u, e, a, ud):
    """e = exp(-g) in; a = act(g) out, and in e: a * u; ud = act'(g) * u."""
    for i in range(g.shape[0]):
        x = g[i]
        s = np.float32(1.0) / (np.float32(1.0) + e[i])
        a[i] = x * s
        e[i] = a[i] * u[i]
        ud[i] = u[i] * s * (np.float32(1.0) + x * (np.float32(1.0) - s))


def gated_and_grad(kind: str, g: F32, u: F32) -> tuple[F32, F32, F32]:
    """(act(g) * u, act(g), act'(g) * u), float32 of g's shape, for "gelu_tanh" or "silu": the MLP's
    hidden activations and the two factors of its backward (d g = d h * act'(g) u, d u = d h * act(g))."""
    flat = np.ascontiguousarray(g, dtype=np.float32).reshape(-1)
    uf = np.ascontiguousarray(u, dtype=np.float32).reshape(-1)
    if uf.shape != flat.shape:
        raise ValueError(f"gate scores {g.shape} and up scores {u.shape} differ in shape")
    a, ud, out = np.empty_like(flat), np.empty_like(flat), np.empty_like(flat)
    if kind == "gelu_tanh":
        _gelu_inner(flat, out)
        np.tanh(out, out=out)
        _gelu_outer(flat, uf, out, a, ud)
    else:
        with np.errstate(over="ignore"):  # exp(-g) of a gate far below 0: inf, and act 0
            np.exp(np.negative(flat, out=out), out=out)
        _silu_outer(flat, uf, out, a, ud)
    return out.reshape(g.shape), a.reshape(g.shape), ud.reshape(g.shape)
