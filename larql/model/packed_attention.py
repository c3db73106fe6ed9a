"""Causal attention of many short contexts at once, forward and backward, for `grad.Tail`.

The value step of an edit runs hundreds of contexts (every fact's prompts behind each prefix) through
the layers above the edit, each contributing a few query rows (its suffix from the subject on) and a
few dozen keys. One small einsum per context and layer cost ~0.1 ms of Python each — on gemma3-270m,
100 facts spent 50 s of a 158 s value step there. Here contexts are laid into padded blocks
(contexts x queries x keys, a mask for the causal window and the padding) and each block is a
handful of batched matmuls. Grouped-query heads share their key/value head without repeating it:
a block's queries are ordered (context, kv head, query row, head within the group).

Exact: the same sums as one context at a time (padded keys get probability 0, padded queries a
zero gradient); tests compare both with the real forward pass and with finite differences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

F32 = NDArray[np.float32]
I64 = NDArray[np.int64]
# A block's padded (context, query, key) cells: beyond it, contexts go to another block (one very
# long user prompt must not pad every short context to its length)
BLOCK_CELLS = 1 << 20


@dataclass
class Block:
    """Contexts `ctx` laid out as `(C, n_max)` query and `(C, s_max)` key slots."""

    ctx: I64  # which contexts (indices into the packed list)
    n_max: int
    s_max: int
    rows: I64  # (m,) stacked suffix rows of these contexts' queries
    q_slots: I64  # (m,) their flat slots in (C * n_max)
    k_slots: I64  # (m,) flat slots in (C * s_max) of the keys those rows write
    prefix_slots: I64  # (P,) flat slots in (C * s_max) of the contexts' prefix keys, in context order
    q_pos: I64  # (C, n_max) positions of the query slots
    masks: dict[int, NDArray[np.bool_]] = field(default_factory=dict)  # window -> (C, 1, n_max * group, s_max)

    def mask(self, window: int, group: int) -> NDArray[np.bool_]:
        """Which keys each query slot sees: causal, within `window` (0: all), never a padded key (a
        padded query repeats its context's last row: finite, and its gradient is zero)."""
        if window not in self.masks:
            k_pos = np.arange(self.s_max)
            allowed = k_pos[None, None, :] <= self.q_pos[:, :, None]  # (C, n_max, s_max)
            if window:
                allowed &= (self.q_pos[:, :, None] - k_pos[None, None, :]) < window
            c = len(self.ctx)
            self.masks[window] = np.repeat(allowed, group, axis=1).reshape(c, 1, self.n_max * group, self.s_max)
        return self.masks[window]


def pack(starts: Sequence[int], lengths: Sequence[int]) -> list[Block]:
    """Blocks for contexts whose suffix rows start at `starts[c]` of `lengths[c]` tokens, stacked in order."""
    n = np.asarray(lengths, np.int64) - np.asarray(starts, np.int64)
    offsets = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
    order = np.argsort(np.asarray(lengths), kind="stable")
    blocks, current, n_max = [], [], 0  # type: ignore[var-annotated]
    for c in order:  # by length: the context just added is the block's longest
        if current and (len(current) + 1) * max(n_max, n[c]) * lengths[c] > BLOCK_CELLS:
            blocks.append(_block(current, starts, lengths, n, offsets))
            current, n_max = [], 0
        current.append(int(c))
        n_max = max(n_max, int(n[c]))
    if current:
        blocks.append(_block(current, starts, lengths, n, offsets))
    return blocks


def _block(ctx: list[int], starts: Sequence[int], lengths: Sequence[int], n: I64, offsets: I64) -> Block:
    n_max = int(max(n[ctx]))
    s_max = int(max(lengths[c] for c in ctx))
    rows, q_slots, k_slots, prefix_slots = [], [], [], []
    q_pos = np.zeros((len(ctx), n_max), np.int64)
    for b, c in enumerate(ctx):
        j = np.arange(n[c])
        rows.append(offsets[c] + j)
        q_slots.append(b * n_max + j)
        k_slots.append(b * s_max + starts[c] + j)
        prefix_slots.append(b * s_max + np.arange(starts[c]))
        q_pos[b] = starts[c] + np.minimum(np.arange(n_max), n[c] - 1)
    def cat(parts: list[I64]) -> I64:
        return np.concatenate(parts).astype(np.int64)

    return Block(np.asarray(ctx, np.int64), n_max, s_max, cat(rows), cat(q_slots), cat(k_slots), cat(prefix_slots),
                 q_pos)


@dataclass
class Saved:
    """One block's forward state for its backward."""

    p: F32  # (C, n_kv, n_max * group, s_max) attention probabilities
    q: F32  # (C, n_kv, n_max * group, d)
    k: F32  # (C, n_kv, s_max, d)
    v: F32  # (C, n_kv, s_max, d)
    capped: F32 | None  # tanh(scores / softcap) with soft-capping


def _heads_first(x: F32, c: int, n_max: int, n_kv: int, group: int, d: int) -> F32:
    """(C * n_max, n_kv * group, d) -> (C, n_kv, n_max * group, d)."""
    return x.reshape(c, n_max, n_kv, group, d).transpose(0, 2, 1, 3, 4).reshape(c, n_kv, n_max * group, d)


def _heads_back(x: F32, c: int, n_max: int, n_kv: int, group: int, d: int) -> F32:
    """The inverse of `_heads_first`."""
    return x.reshape(c, n_kv, n_max, group, d).transpose(0, 2, 1, 3, 4).reshape(c * n_max, n_kv * group, d)


def attend(block: Block, q: F32, k: F32, v: F32, prefix_k: F32, prefix_v: F32, window: int, scale: float,
           softcap: float) -> tuple[F32, Saved]:
    """q `(N, H, d)`, k and v `(N, n_kv, d)` at every stacked suffix row; `prefix_k`/`prefix_v`
    `(P, n_kv, d)` the block's contexts' prefix keys in order -> z `(m, H * d)` for `block.rows`."""
    c, (n_heads, d), n_kv = len(block.ctx), q.shape[1:], k.shape[1]
    group = n_heads // n_kv
    qp = np.zeros((c * block.n_max, n_heads, d), np.float32)
    qp[block.q_slots] = q[block.rows]
    kp = np.zeros((c * block.s_max, n_kv, d), np.float32)
    vp = np.zeros_like(kp)
    kp[block.prefix_slots], vp[block.prefix_slots] = prefix_k, prefix_v
    kp[block.k_slots], vp[block.k_slots] = k[block.rows], v[block.rows]
    q4 = _heads_first(qp, c, block.n_max, n_kv, group, d)  # (C, n_kv, n_max * group, d)
    k4 = kp.reshape(c, block.s_max, n_kv, d).transpose(0, 2, 1, 3)  # (C, n_kv, s_max, d)
    v4 = vp.reshape(c, block.s_max, n_kv, d).transpose(0, 2, 1, 3)
    scores = (q4 @ k4.transpose(0, 1, 3, 2)) * np.float32(scale)  # (C, n_kv, n_max * group, s_max)
    capped: F32 | None = None
    if softcap:
        capped = np.tanh(scores / np.float32(softcap))
        scores = capped * np.float32(softcap)
    scores = np.where(block.mask(window, group), scores, np.float32(-np.inf))
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    z = _heads_back(p @ v4, c, block.n_max, n_kv, group, d)  # (C * n_max, H, d)
    return z[block.q_slots].reshape(len(block.rows), -1), Saved(p, q4, k4, v4, capped)


def attend_back(block: Block, dz: F32, s: Saved, scale: float) -> tuple[F32, F32, F32]:
    """dz `(m, H * d)` for `block.rows` -> dq `(m, H, d)`, dk and dv `(m, n_kv, d)` at those rows (the
    prefix keys are constants)."""
    c, n_kv, d = len(block.ctx), s.k.shape[1], s.k.shape[3]
    n_heads = dz.shape[1] // d
    group = n_heads // n_kv
    dzp = np.zeros((c * block.n_max, n_heads, d), np.float32)
    dzp[block.q_slots] = dz.reshape(-1, n_heads, d)
    dz4 = _heads_first(dzp, c, block.n_max, n_kv, group, d)
    dp = dz4 @ s.v.transpose(0, 1, 3, 2)  # (C, n_kv, n_max * group, s_max)
    dv4 = s.p.transpose(0, 1, 3, 2) @ dz4  # (C, n_kv, s_max, d)
    ds = s.p * (dp - np.sum(dp * s.p, axis=-1, keepdims=True))
    if s.capped is not None:
        ds = ds * (np.float32(1.0) - s.capped ** 2)
    ds = ds * np.float32(scale)
    dq4 = ds @ s.k  # (C, n_kv, n_max * group, d)
    dk4 = ds.transpose(0, 1, 3, 2) @ s.q  # (C, n_kv, s_max, d)
    dq = _heads_back(dq4, c, block.n_max, n_kv, group, d)[block.q_slots]

    def keys(x: F32) -> F32:
        return x.transpose(0, 2, 1, 3).reshape(c * block.s_max, n_kv, d)[block.k_slots]

    return dq, keys(dk4), keys(dv4)
