"""Reusing the KV cache of an earlier prompt for the token prefix a new prompt shares with it.

Attention is causal, so the keys and values of positions 0..n-1 depend only on tokens 0..n-1: a
prompt that starts with the same n tokens as one run before can start from a copy of that run's
cache at length n and run only its own tail. DESCRIBE's probe prompts are two fixed worked examples
and then the entity, so from the second entity on each template runs a few tokens instead of ~25.

A kept cache is reused only while the model computes what it computed then: `Model.revision()`
names that state (the FFN edit strategy's revision), and a model that cannot name it (an edit
strategy without a revision, an FFN served elsewhere) reuses nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Protocol

from larql.model.attention import KVCache

# kept prompts per model (DESCRIBE uses 8, one per relation template); the oldest goes first
SLOTS = 32


class CachingModel(Protocol):
    """What a PrefixCache asks of a model (model.py Model): the state its caches were computed in,
    and an empty cache of its shape."""

    def revision(self) -> Hashable | None: ...

    def new_cache(self, capacity: int = 256) -> KVCache: ...


def fork(cache: KVCache, length: int, capacity: int) -> KVCache:
    """A new cache holding the first `length` positions of `cache`, with room for `capacity`."""
    new = KVCache(cache.n_layers, cache.n_kv_heads, cache.head_dim, max(capacity, length))
    for dst, src in ((new.k, cache.k), (new.v, cache.v)):
        for layer in range(cache.n_layers):
            dst[layer][:, :length] = src[layer][:, :length]
    new.length = length
    new.ids, new.rope_long = cache.ids[:length].copy(), cache.rope_long
    return new


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixCache:
    """Caches of earlier prompts under a caller's key (e.g. a probe template), for one model."""

    def __init__(self, slots: int = SLOTS) -> None:
        self.slots = slots
        self._kept: OrderedDict[Hashable, tuple[object, list[int], KVCache]] = OrderedDict()
        self._lock = threading.Lock()  # a served model answers several clients

    def start(self, model: CachingModel, key: Hashable, ids: Sequence[int], extra: int = 0) -> tuple[KVCache, list[int]]:
        """(a cache already holding the longest prefix of `ids` kept under `key`, the ids still to
        run); at least the last id is left to run, so its logits come out. `extra`: room for more."""
        ids = list(ids)
        revision = model.revision()
        with self._lock:
            kept = self._kept.get(key)
        if kept is None or revision is None or kept[0] != revision:
            return model.new_cache(len(ids) + extra), ids
        _, kept_ids, kept_cache = kept
        n = min(common_prefix(kept_ids, ids), len(ids) - 1, kept_cache.length)
        if n == 0:
            return model.new_cache(len(ids) + extra), ids
        # positions < n of a kept cache are never rewritten (its owner only appends after them)
        return fork(kept_cache, n, len(ids) + extra), ids[n:]

    def keep(self, model: CachingModel, key: Hashable, ids: Sequence[int], cache: KVCache) -> None:
        """Keep `cache`, which holds at least `ids`' positions, for later prompts under `key`."""
        revision = model.revision()
        if revision is None:
            return
        with self._lock:
            self._kept[key] = (revision, list(ids), cache)
            self._kept.move_to_end(key)
            while len(self._kept) > self.slots:
                self._kept.popitem(last=False)
