"""Numba versions of the forward pass's small row-wise steps (RMS norm).

In decode each of these runs on a single 640-2048-float row, where numpy's per-call and
per-temporary overheads cost more than the arithmetic (the six norms of a Gemma layer took 1.5 ms
of an 18 ms token). Same formulas as the numpy definitions in forward.py; the mean of squares is
accumulated in float64 (8 partial sums), which is at least as accurate as numpy's pairwise float32 sum.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, fastmath=False)
def _sum_squares(x):
    """sum(x*x) of a float32 row in float64, in 8 interleaved partial sums: independent additions
    that run side by side (one running sum waited ~4 cycles per element: a prefill's 256 x 640
    norm took 0.2 ms), each still exact to float64 rounding."""
    n = x.shape[0]
    part = np.zeros(8, dtype=np.float64)
    n8 = n // 8 * 8
    for i in range(0, n8, 8):
        for j in range(8):
            v = np.float64(x[i + j])
            part[j] += v * v
    tail = 0.0
    for i in range(n8, n):
        v = np.float64(x[i])
        tail += v * v
    return (((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]))) + tail


@njit(cache=True, fastmath=False)
def rms_norm_rows(x, weight, eps, out):
    """out[r] = x[r] / rms(x[r]) * weight, for x `[rows, n]` float32."""
    n = x.shape[1]
    for r in range(x.shape[0]):
        inv = np.float32(1.0) / np.sqrt(np.float32(_sum_squares(x[r]) / n) + eps)
        for i in range(n):
            out[r, i] = (x[r, i] * inv) * weight[i]


@njit(cache=True, fastmath=True)
def attend_one(q, keys, values, first, stop, scale, softcap, out):
    """One query position (decode) over keys/values `(n_kv, capacity, d)` at positions first..stop-1,
    causal by construction (the cache holds only earlier positions); q and out `(n_heads, d)`.

    Softmax(q.k * scale, optionally soft-capped) then the weighted sum of values, per head, with
    n_heads / n_kv query heads sharing each key/value head. numpy spent ~90 us on the dozen small
    array calls this replaces (Gemma, 256 positions).
    """
    n_heads, d = q.shape
    n_kv, s = keys.shape[0], stop
    group = n_heads // n_kv
    weights = np.empty(s - first, dtype=np.float32)
    for h in range(n_heads):
        kv = h // group
        top = np.float32(-np.inf)
        for j in range(first, s):
            acc = np.float32(0.0)
            for i in range(d):
                acc += q[h, i] * keys[kv, j, i]
            score = acc * scale
            if softcap != 0.0:
                score = np.tanh(score / softcap) * softcap
            weights[j - first] = score
            top = max(top, score)
        total = np.float32(0.0)
        for j in range(s - first):
            e = np.exp(weights[j] - top)
            weights[j] = e
            total += e
        inv = np.float32(1.0) / total
        for i in range(d):
            out[h, i] = np.float32(0.0)
        for j in range(s - first):
            p = weights[j] * inv
            for i in range(d):
                out[h, i] += p * values[kv, first + j, i]


@njit(cache=True, fastmath=False)
def _rms_norm_row(x, weight, eps, out):
    """rms_norm_rows of one row, x and out `[n]` (the same operations, so the same bits)."""
    n = x.shape[0]
    inv = np.float32(1.0) / np.sqrt(np.float32(_sum_squares(x) / n) + eps)
    for i in range(n):
        out[i] = (x[i] * inv) * weight[i]


@njit(cache=True, fastmath=False)
def _rope_row(x, cos, sin, interleaved, out):
    """apply_rope of one head `[d]` at one position (cos, sin `[d/2]`): the same products and sums."""
    half = cos.shape[0]
    for i in range(half):
        if interleaved:
            x1, x2 = x[2 * i], x[2 * i + 1]
            out[2 * i] = x1 * cos[i] - x2 * sin[i]
            out[2 * i + 1] = x2 * cos[i] + x1 * sin[i]
        else:
            x1, x2 = x[i], x[half + i]
            out[i] = x1 * cos[i] - x2 * sin[i]
            out[half + i] = x2 * cos[i] + x1 * sin[i]


@njit(cache=True, fastmath=False)
def decode_qk(q, k, v, q_norm, k_norm, qk_norm, eps, cos, sin, rope, interleaved, keys, values, pos, qr):
    """A decode step's attention inputs in one call: q `(n_heads, d)`, k and v `(n_kv, d)` -> optional
    per-head RMS norms (q_norm, k_norm `[d]`) and rotation at position `pos` (cos, sin `[d/2]`); the
    query into qr `(n_heads, d)`, k and v into the cache `(n_kv, capacity, d)` at pos. The forward
    pass's separate steps do the same operations (test: the same bits); this saves ~5 Python calls
    a layer. `attend_one` then runs as its own call: inlined here its fastmath sums could be
    reordered, and the results would differ in the last bits from the general path's."""
    n_heads, d = q.shape
    tmp = np.empty(d, dtype=np.float32)
    for h in range(n_heads + k.shape[0]):
        src = q[h] if h < n_heads else k[h - n_heads]
        if qk_norm:
            _rms_norm_row(src, q_norm if h < n_heads else k_norm, eps, tmp)
        else:
            for i in range(d):
                tmp[i] = src[i]
        dst = qr[h] if h < n_heads else keys[h - n_heads, pos]
        if rope:
            _rope_row(tmp, cos, sin, interleaved, dst)
        else:
            for i in range(d):
                dst[i] = tmp[i]
    for h in range(k.shape[0]):
        for i in range(d):
            values[h, pos, i] = v[h, i]


@njit(cache=True, fastmath=False)
def rope_rows(x, cos, sin, interleaved, out):
    """apply_rope of x `(T, heads, d)` with cos, sin `(T, d/2)` into out: per element the same
    products and sums as the numpy definition, without its four temporaries and a concatenate."""
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            _rope_row(x[t, h], cos[t], sin[t], interleaved, out[t, h])
