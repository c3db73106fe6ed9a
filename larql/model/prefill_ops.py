"""Numba passes for a prefill's element-wise steps: the gated MLP's act(gate) * up, and causal
attention's scale, mask and softmax; the transcendental (tanh, exp) stays numpy's.

Why: numpy ran each step as a chain of whole-array passes, each reading and writing a (256, 2048)
float32 array (2 MB) — gelu_tanh(gate) * up took 8 of them; the softmax of one block of queries 6
(mask, max, subtract, exp, sum, divide) and a broadcast mask. Here the polynomial parts are numba
loops that call nothing, so LLVM vectorises them, and tanh / exp go to numpy's SIMD versions (a
numba loop calls a scalar tanh or exp per element, several times slower; docs/design/cpu-paths.md).
No fastmath: every product and sum is the numpy definition's, in its order, so
the activations are the same bits (tests); the softmax's row sum is the one change of order.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.typing import NDArray

F32 = NDArray[np.float32]
_C = np.float32(np.sqrt(2.0 / np.pi))
_K = np.float32(0.044715)


@njit(cache=True, fastmath=False)
def _gelu_inner(g: F32, t: F32) -> None:  # pragma: no cover - numba
    """t = C * (x + 0.044715 x^3), as ffn.gelu_tanh's in-place steps round it: ((K x) x) x + x, times C."""
    for i in range(g.shape[0]):
        x = g[i]
        t[i] = (((_K * x) * x) * x + x) * _C


@njit(cache=True, fastmath=False)
def _gelu_outer(g: F32, t: F32, u: F32) -> None:  # pragma: no cover - numba
    """t = tanh(inner) in; t = (0.5 x) (1 + t) * u out (gelu_tanh's 0.5 x (1 + tanh), then * up)."""
    for i in range(g.shape[0]):
        t[i] = ((np.float32(0.5) * g[i]) * (t[i] + np.float32(1.0))) * u[i]


@njit(cache=True, fastmath=False)
def _silu_outer(g: F32, e: F32, u: F32) -> None:  # pragma: no cover - numba
    """e = exp(-x) in; e = x / (1 + e) * u out (ffn.silu's x / (exp(-x) + 1), then * up)."""
    for i in range(g.shape[0]):
        e[i] = (g[i] / (e[i] + np.float32(1.0))) * u[i]


def gated_mul(activation: str, gate: F32, up: F32) -> F32:
    """act(gate) * up for "gelu_tanh" or "silu", float32 C-contiguous of one shape `(T, ffn)`, in a
    new array (neither input is written: an edit's top-k reads the gate scores after): the same bits
    as ffn.gated's numpy steps."""
    out = np.empty_like(gate)  # (T, ffn)
    with np.errstate(over="ignore"):  # exp(-x) = inf far below 0 (an inserted gate): x / inf = 0
        gated_mul_into(activation, gate.reshape(-1), up.reshape(-1), out.reshape(-1))
    return out


def gated_mul_into(activation: str, g: F32, u: F32, out: F32) -> None:
    """gated_mul's steps on flat float32 rows into `out` (a third array): the inner term, then numpy's
    tanh / exp of it, then the product. Overflow in exp is the caller's to ignore (a decode step
    does once for all its layers, decode_layer.py)."""
    if activation == "gelu_tanh":
        _gelu_inner(g, out)
        np.tanh(out, out=out)
        _gelu_outer(g, out, u)
    else:
        np.exp(np.negative(g, out=out), out=out)
        _silu_outer(g, out, u)


@njit(cache=True, fastmath=False)
def _mask(s: F32, group: int, start: int, first: int, window: int, scale: np.float32, scaled: bool,
          shift: bool) -> None:  # pragma: no cover - numba
    """s `(n_kv, T*group, S')` scores in place -> score * scale where query row i*group+g (position
    start+i) may see key column j (position first+j): first+j <= start+i and, with a window,
    start+i - (first+j) < window; -inf elsewhere (exp gives 0). `scaled`: the scale was applied
    already (soft-capped scores); `shift`: minus the row's largest seen score too."""
    n = s.shape[2]
    for h in range(s.shape[0]):
        for r in range(s.shape[1]):
            pos = start + r // group
            hi = min(n, pos - first + 1)  # columns lo..hi-1 are seen
            lo = max(0, pos - window + 1 - first) if window else 0
            row = s[h, r]
            top = np.float32(-np.inf)
            for j in range(lo, hi):
                v = row[j] if scaled else row[j] * scale
                row[j] = v
                top = max(top, v)
            if shift:
                for j in range(lo, hi):
                    row[j] = row[j] - top
            for j in range(lo):
                row[j] = -np.inf
            for j in range(max(hi, 0), n):
                row[j] = -np.inf


@njit(cache=True, fastmath=False)
def _shift(s: F32) -> None:  # pragma: no cover - numba
    """Each row of s `(n_kv, rows, S')` minus its largest entry (numpy's `s - s.max(-1)`)."""
    for h in range(s.shape[0]):
        for r in range(s.shape[1]):
            row = s[h, r]
            top = row[0]
            for j in range(1, row.shape[0]):
                top = max(top, row[j])
            for j in range(row.shape[0]):
                row[j] = row[j] - top


@njit(cache=True, fastmath={"reassoc", "nsz"})
def _row_sum(row: F32) -> np.float32:  # pragma: no cover - numba
    """sum(row) in float32, reassociated so that LLVM sums in vector lanes (as numpy's pairwise sum
    does, the same accuracy; one running sum waited on each addition)."""
    total = np.float32(0.0)
    for j in range(row.shape[0]):
        total += row[j]
    return total


@njit(cache=True, fastmath=False)
def _normalise(p: F32) -> None:  # pragma: no cover - numba
    """Each row of p `(n_kv, rows, S')` divided by its sum."""
    for h in range(p.shape[0]):
        for r in range(p.shape[1]):
            row = p[h, r]
            total = _row_sum(row)
            for j in range(row.shape[0]):
                row[j] = row[j] / total


def causal_softmax(scores: F32, group: int, start: int, first: int, window: int, scale: float,
                   scaled: bool) -> F32:
    """softmax over the keys a query may see of (scores * scale), in place on C-contiguous float32
    scores `(n_kv, T*group, S')` (rows query-major: row i*group+g is query i's head g of its group;
    `scaled`: the scale is applied already); numpy's scale, mask, max, exp, sum and divide within
    float rounding (the row sum's order differs)."""
    _mask(scores, group, start, first, window, np.float32(scale), scaled, True)
    np.exp(scores, out=scores)
    _normalise(scores)
    return scores


def causal_mask(scores: F32, group: int, start: int, first: int, window: int, scale: float, scaled: bool) -> F32:
    """`causal_softmax`'s first step alone, in place: scores * scale where seen, -inf elsewhere (what
    a scores hook sees); `softmax_rows` then gives `causal_softmax`'s bits."""
    _mask(scores, group, start, first, window, np.float32(scale), scaled, False)
    return scores


def softmax_rows(scores: F32) -> F32:
    """softmax of each row of C-contiguous float32 scores `(n_kv, rows, S')`, in place (no mask)."""
    _shift(scores)
    np.exp(scores, out=scores)
    _normalise(scores)
    return scores
