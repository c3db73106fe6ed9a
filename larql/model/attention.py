"""RoPE, the KV cache and grouped-query attention with causal and sliding-window masks (numpy, float32)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from larql.model import fused, prefill_ops

F32 = NDArray[np.float32]


class RopeTable:
    """cos/sin of position x frequency for one set of `(d/2,)` frequencies, grown on demand.

    Built as HF does, in float32: angle = position * inv_freq (see ModelConfig.rope_inv_freq);
    cos and sin times `scale` (longrope's attention factor, 1 otherwise).
    """

    def __init__(self, inv_freq: F32, scale: float = 1.0) -> None:
        self.inv_freq = np.asarray(inv_freq, dtype=np.float32)  # (d/2,)
        self.scale = np.float32(scale)
        empty = np.empty((0, len(self.inv_freq)), dtype=np.float32)
        # (cos, sin), replaced whole when grown: threads sharing a model (larql serve's sessions) read
        # one pair, never a new cos beside an old sin, nor one not yet scaled
        self.table: tuple[F32, F32] = (empty, empty)

    def get(self, start: int, stop: int) -> tuple[F32, F32]:
        cos, sin = self.table
        if stop > len(cos):
            n = max(stop, 2 * len(cos), 256)
            angles = np.arange(n, dtype=np.float32)[:, None] * self.inv_freq[None, :]  # (n, d/2)
            cos, sin = np.cos(angles), np.sin(angles)
            if self.scale != 1.0:
                cos, sin = cos * self.scale, sin * self.scale
            self.table = (cos, sin)
        return cos[start:stop], sin[start:stop]


def apply_rope(x: F32, cos: F32, sin: F32, interleaved: bool) -> F32:
    """Rotate x `(T, heads, d)` by position. cos/sin are `(T, d/2)`.

    Rotate-half layout (HF, Gemma GGUF): pairs (x[i], x[i + d/2]).
    Interleaved layout (GGUF llama, whose q/k rows llama.cpp's converter permuted): pairs (x[2i], x[2i+1]).
    """
    if x.dtype == np.float32 and cos.dtype == np.float32 and sin.dtype == np.float32:
        out = np.empty(x.shape, dtype=np.float32)  # (T, heads, d)
        fused.rope_rows(np.ascontiguousarray(x), np.ascontiguousarray(cos), np.ascontiguousarray(sin), interleaved, out)
        return out
    c, s = cos[:, None, :], sin[:, None, :]  # (T, 1, d/2)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]  # (T, heads, d/2) each
        out = np.empty_like(x)
        out[..., 0::2] = x1 * c - x2 * s
        out[..., 1::2] = x2 * c + x1 * s
        return out
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


class KVCache:
    """Per-layer keys and values `(n_kv_heads, capacity, head_dim)`; `length` positions are filled."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int = 256) -> None:
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.capacity = capacity
        self.k = [np.zeros((n_kv_heads, capacity, head_dim), dtype=np.float32) for _ in range(n_layers)]
        self.v = [np.zeros((n_kv_heads, capacity, head_dim), dtype=np.float32) for _ in range(n_layers)]
        self.length = 0
        # longrope models only: the token ids behind the cached positions, and whether their keys
        # were rotated with the long factors; a pass needing the other factors re-runs those ids
        self.ids = np.empty(0, dtype=np.int64)
        self.rope_long = False

    def reserve(self, total: int) -> None:
        """Make room for `total` positions (doubling, so appends stay amortised O(1))."""
        if total <= self.capacity:
            return
        new_cap = max(total, 2 * self.capacity)
        for store in (self.k, self.v):
            for i, old in enumerate(store):
                grown = np.zeros((self.n_kv_heads, new_cap, self.head_dim), dtype=np.float32)
                grown[:, : self.length] = old[:, : self.length]
                store[i] = grown
        self.capacity = new_cap

    def write(self, layer: int, start: int, k: F32, v: F32) -> tuple[F32, F32]:
        """Store k/v `(T, n_kv, d)` at positions start.. and return all keys/values so far."""
        stop = start + k.shape[0]
        self.k[layer][:, start:stop] = k.transpose(1, 0, 2)
        self.v[layer][:, start:stop] = v.transpose(1, 0, 2)
        return self.k[layer][:, :stop], self.v[layer][:, :stop]  # (n_kv, S, d)


def _whole_cache(a: F32) -> F32:
    """The C-contiguous cache array `(n_kv, capacity, d)` whose [:, :S] view `a` is (a strided view
    would keep numba from vectorizing: 137 vs 30 us per SmolLM2 layer), else a contiguous copy."""
    b = a.base
    if (isinstance(b, np.ndarray) and b.ndim == 3 and b.flags.c_contiguous and b.dtype == a.dtype
            and b.shape[0] == a.shape[0] and b.shape[2] == a.shape[2] and b.ctypes.data == a.ctypes.data):
        return b
    return np.ascontiguousarray(a)


# Prefill attention runs in blocks of this many queries, each block against the keys up to its last
# position only: the scores above the causal diagonal are then mostly not computed (nor masked, nor
# exponentiated), rather than computed and masked.
CAUSAL_CHUNK = 64


def attention(q: F32, keys: F32, values: F32, start: int, scale: float, window: int, softcap: float,
              scores_hook: Callable[[F32], F32] | None = None, pattern_hook: Callable[[F32], F32] | None = None) -> F32:
    """Causal grouped-query attention.

    q `(T, n_heads, d)` for positions start..start+T-1; keys/values `(n_kv, S, d)` for positions 0..S-1.
    Query i sees key j when j <= i and, with a sliding window, i - j < window. Returns `(T, n_heads * d)`.
    The hooks see and may replace scores (masked, pre-softmax) and the pattern as `(T, n_heads, S)`.
    """
    t, n_heads, d = q.shape
    s = keys.shape[1]
    first = 0
    hooked = scores_hook is not None or pattern_hook is not None
    if t == 1 and not hooked:  # decode: one query and the cached keys it may see
        out = np.empty((n_heads, d), dtype=np.float32)
        first = max(0, start - window + 1) if window else 0
        fused.attend_one(np.ascontiguousarray(q[0]), _whole_cache(keys), _whole_cache(values), first, s,
                         np.float32(scale), np.float32(softcap or 0.0), out)
        return out.reshape(1, n_heads * d)
    if t > 2 * CAUSAL_CHUNK and not hooked:  # query blocks, each against the keys it can see: ~5/8 of the work at T=256
        out = np.empty((t, n_heads * d), dtype=np.float32)  # (T, n_heads*d)
        for a in range(0, t, CAUSAL_CHUNK):
            b = min(t, a + CAUSAL_CHUNK)
            out[a:b] = attention(q[a:b], keys[:, :start + b], values[:, :start + b], start + a, scale, window, softcap)
        return out
    if window and start + t > window and not hooked:  # keys no query can see are skipped, not masked
        first = max(0, start - window + 1)
        keys, values = keys[:, first:], values[:, first:]
    return _attend_block(q, keys, values, start, first, scale, window, softcap, scores_hook, pattern_hook)


def _attend_block(q: F32, keys: F32, values: F32, start: int, first: int, scale: float, window: int,
                  softcap: float, scores_hook: Callable[[F32], F32] | None = None,
                  pattern_hook: Callable[[F32], F32] | None = None) -> F32:
    """`attention` of queries q `(T, n_heads, d)` at positions start.. over keys and values
    `(n_kv, S', d)` at positions first..: the rows ordered query-major (a view of q when n_kv == 1,
    and the output is then (T, n_heads*d) as it comes, no transposes); the scale, mask and softmax
    in prefill_ops' passes rather than numpy's whole-array steps, which read and write the scores
    once per step. With hooks the same passes, split where the hooks look (the same bits as without)."""
    t, n_heads, d = q.shape
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    q, keys, values = (np.asarray(a, dtype=np.float32) for a in (q, keys, values))
    qg = q.reshape(t, n_kv, group, d).transpose(1, 0, 2, 3).reshape(n_kv, t * group, d)  # (n_kv, T*group, d)
    scores = np.matmul(qg, keys.transpose(0, 2, 1))  # (n_kv, T*group, S')
    s = scores.shape[2]
    if softcap:
        scores *= np.float32(scale)
        scores /= np.float32(softcap)
        np.tanh(scores, out=scores)
        scores *= np.float32(softcap)
    if scores_hook is None:
        prefill_ops.causal_softmax(scores, group, start, first, window, scale, bool(softcap))  # (n_kv, T*group, S')
    else:
        prefill_ops.causal_mask(scores, group, start, first, window, scale, bool(softcap))
        heads_view = scores.reshape(n_kv, t, group, s).transpose(1, 0, 2, 3).reshape(t, n_heads, s)  # (T, H, S)
        scores = _rows(scores_hook(heads_view), n_kv, group)
        prefill_ops.softmax_rows(scores)  # (n_kv, T*group, S')
    if pattern_hook is not None:
        heads_view = scores.reshape(n_kv, t, group, s).transpose(1, 0, 2, 3).reshape(t, n_heads, s)  # (T, H, S)
        scores = _rows(pattern_hook(heads_view), n_kv, group)
    out = np.matmul(scores, values)  # (n_kv, T*group, d)
    return out.reshape(n_kv, t, group, d).transpose(1, 0, 2, 3).reshape(t, n_heads * d)


def _rows(heads: F32, n_kv: int, group: int) -> F32:
    """A hook's `(T, n_heads, S)` back to the query-major rows `(n_kv, T*group, S)`, a float32 copy
    (the softmax then works in place, and an array a hook kept must not change under it)."""
    t, _, s = heads.shape
    rows = np.asarray(heads, dtype=np.float32).reshape(t, n_kv, group, s).transpose(1, 0, 2, 3)
    return np.array(rows, dtype=np.float32, order="C", copy=True).reshape(n_kv, t * group, s)
