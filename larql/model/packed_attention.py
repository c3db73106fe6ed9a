"""Causal attention of many short contexts at once, forward and backward, for `grad.Tail`.

The value step of an edit runs hundreds of contexts (every fact's prompts behind each prefix) through
the layers above the edit, each contributing a few query rows (its suffix from the subject on) and a
few dozen keys. The rows of all contexts are stacked; two numba loops walk them, each row attending
to its own context's keys only (its prefix's, which are constants, then its suffix's up to itself),
so nothing is padded and no mask is built. Per row and head the work is a few dozen 256-long dot
products: the padded-block numpy version this replaces (contexts x queries x keys, a mask, a
softmax over the padding, a dozen array passes) spent 12% of a value step there, the loops ~2%.
Grouped-query heads read their key/value head directly. One thread: numba's workers, spinning after
a parallel loop, slow the BLAS calls around it (model/activation_grad.py).

Exact up to float32 summation order (tests compare with one context at a time in float64 and with
finite differences).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit
from numpy.typing import NDArray

F32 = NDArray[np.float32]
I64 = NDArray[np.int64]
_FAST = {"nsz", "arcp", "contract", "reassoc"}  # no no-NaN/no-Inf assumption: exp(-inf) must be 0


@dataclass(frozen=True)
class Packing:
    """Where each context's rows sit among the stacked suffix rows and its keys among the prefixes'."""

    row_ctx: I64  # (N,) the context of each stacked row
    row_pos: I64  # (N,) its position in that context
    ctx_row0: I64  # (C,) each context's first stacked row
    ctx_start: I64  # (C,) its first suffix position (= its number of prefix keys)
    ctx_pre0: I64  # (C,) where its prefix keys start in the stacked prefix keys


def pack(starts: Sequence[int], lengths: Sequence[int]) -> Packing:
    """Contexts whose suffix rows start at `starts[c]` of `lengths[c]` tokens, stacked in order (and
    their prefix keys stacked in the same order)."""
    start, length = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    n = length - start
    row0 = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
    pre0 = np.concatenate([[0], np.cumsum(start)[:-1]]).astype(np.int64)
    row_ctx = np.repeat(np.arange(len(n), dtype=np.int64), n)
    row_pos = (np.arange(int(n.sum()), dtype=np.int64) - row0[row_ctx] + start[row_ctx]).astype(np.int64)
    return Packing(row_ctx, row_pos, row0, start, pre0)


@dataclass
class Saved:
    """The forward's state for its backward."""

    p: F32  # ragged: row r's head h's probability of key j (position lo + j) at base[r] + h * keys[r] + j
    capped: F32  # the same layout: tanh(score / softcap) with soft-capping, else empty
    base: I64  # (N,) where each row's cells start
    keys: I64  # (N,) how many keys each row sees (its causal window)
    q: F32  # (N, H, d)
    k: F32  # (N, n_kv, d)
    v: F32
    prefix_k: F32  # (P, n_kv, d)
    prefix_v: F32
    window: int
    softcap: float


@njit(cache=True, fastmath=_FAST)
def _key_row(pos, start, row0, pre0):
    """Where the key at `pos` of a context is: (in the prefix keys?, its row there)."""
    if pos < start:
        return True, pre0 + pos
    return False, row0 + pos - start


@njit(cache=True, fastmath=_FAST)
def _forward(q, k, v, pk, pv, row_ctx, row_pos, ctx_row0, ctx_start, ctx_pre0, window, scale, softcap, base, z, p,
             capped):
    n_heads, d = q.shape[1], q.shape[2]
    group = n_heads // k.shape[1]
    for r in range(q.shape[0]):
        c, pos = row_ctx[r], row_pos[r]
        lo = max(0, pos - window + 1) if window > 0 else 0
        for h in range(n_heads):
            kh = h // group
            o = base[r] + h * (pos - lo + 1)  # this row and head's cells
            best = np.float32(-np.inf)
            for j in range(pos - lo + 1):
                in_prefix, kr = _key_row(lo + j, ctx_start[c], ctx_row0[c], ctx_pre0[c])
                keys = pk if in_prefix else k  # one array type: numba picks the source, the loop is one
                s = np.float32(0.0)
                for e in range(d):
                    s += q[r, h, e] * keys[kr, kh, e]
                s *= scale
                if softcap > 0:
                    t = np.tanh(s / softcap)
                    capped[o + j] = t
                    s = t * softcap
                p[o + j] = s
                best = max(best, s)
            total = np.float32(0.0)
            for j in range(pos - lo + 1):
                w = np.exp(p[o + j] - best)
                p[o + j] = w
                total += w
            for e in range(d):
                z[r, h, e] = 0.0
            for j in range(pos - lo + 1):
                w = p[o + j] / total
                p[o + j] = w
                in_prefix, kr = _key_row(lo + j, ctx_start[c], ctx_row0[c], ctx_pre0[c])
                values = pv if in_prefix else v
                for e in range(d):
                    z[r, h, e] += w * values[kr, kh, e]


@njit(cache=True, fastmath=_FAST)
def _backward(dz, q, k, v, pk, pv, p, capped, row_ctx, row_pos, ctx_row0, ctx_start, ctx_pre0, window, scale,
              softcap, base, max_keys, dq, dk, dv):
    n_heads, d = q.shape[1], q.shape[2]
    group = n_heads // k.shape[1]
    dp = np.empty(max_keys, np.float32)
    for r in range(q.shape[0]):
        c, pos = row_ctx[r], row_pos[r]
        lo = max(0, pos - window + 1) if window > 0 else 0
        for h in range(n_heads):
            kh = h // group
            o = base[r] + h * (pos - lo + 1)
            mean = np.float32(0.0)  # sum over keys of p * dp
            for j in range(pos - lo + 1):
                in_prefix, kr = _key_row(lo + j, ctx_start[c], ctx_row0[c], ctx_pre0[c])
                values = pv if in_prefix else v
                s = np.float32(0.0)
                for e in range(d):
                    s += dz[r, h, e] * values[kr, kh, e]
                dp[j] = s
                mean += p[o + j] * s
            for j in range(pos - lo + 1):
                ds = p[o + j] * (dp[j] - mean)
                if softcap > 0:
                    ds *= np.float32(1.0) - capped[o + j] * capped[o + j]
                ds *= scale
                in_prefix, kr = _key_row(lo + j, ctx_start[c], ctx_row0[c], ctx_pre0[c])
                if in_prefix:  # the prefix keys and values are constants
                    for e in range(d):
                        dq[r, h, e] += ds * pk[kr, kh, e]
                else:
                    w = p[o + j]
                    for e in range(d):
                        dq[r, h, e] += ds * k[kr, kh, e]
                        dk[kr, kh, e] += ds * q[r, h, e]
                        dv[kr, kh, e] += w * dz[r, h, e]


def attend(packing: Packing, q: F32, k: F32, v: F32, prefix_k: F32, prefix_v: F32, window: int, scale: float,
           softcap: float) -> tuple[F32, Saved]:
    """q `(N, H, d)`, k and v `(N, n_kv, d)` at every stacked suffix row; `prefix_k`/`prefix_v`
    `(P, n_kv, d)` the contexts' prefix keys in context order -> z `(N, H * d)`."""
    q, k, v = (np.ascontiguousarray(a, dtype=np.float32) for a in (q, k, v))
    prefix_k, prefix_v = (np.ascontiguousarray(a, dtype=np.float32) for a in (prefix_k, prefix_v))
    n, n_heads, d = q.shape
    z = np.empty((n, n_heads, d), np.float32)
    # each row stores only the keys it sees (one long user prompt must not widen every row's cells)
    lo = np.maximum(0, packing.row_pos - window + 1) if window > 0 else np.zeros_like(packing.row_pos)
    keys = (packing.row_pos - lo + 1).astype(np.int64)  # (N,)
    base = np.concatenate([[0], np.cumsum(keys * n_heads)[:-1]]).astype(np.int64)
    cells = int(keys.sum()) * n_heads
    p = np.empty(cells, np.float32)
    capped = np.empty(cells if softcap else 0, np.float32)
    _forward(q, k, v, prefix_k, prefix_v, packing.row_ctx, packing.row_pos, packing.ctx_row0, packing.ctx_start,
             packing.ctx_pre0, int(window), np.float32(scale), np.float32(softcap), base, z, p, capped)
    return z.reshape(n, -1), Saved(p, capped, base, keys, q, k, v, prefix_k, prefix_v, int(window), float(softcap))


def attend_back(packing: Packing, dz: F32, s: Saved, scale: float) -> tuple[F32, F32, F32]:
    """dz `(N, H * d)` -> dq `(N, H, d)`, dk and dv `(N, n_kv, d)` (the prefix keys are constants)."""
    dz3 = np.ascontiguousarray(dz, dtype=np.float32).reshape(s.q.shape)
    dq, dk, dv = np.zeros_like(s.q), np.zeros_like(s.k), np.zeros_like(s.v)
    _backward(dz3, s.q, s.k, s.v, s.prefix_k, s.prefix_v, s.p, s.capped, packing.row_ctx, packing.row_pos,
              packing.ctx_row0, packing.ctx_start, packing.ctx_pre0, s.window, np.float32(scale),
              np.float32(s.softcap), s.base, int(s.keys.max()) if len(s.keys) else 0, dq, dk, dv)
    return dq, dk, dv
