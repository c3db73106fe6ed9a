"""Activations at a few hook points, from a forward pass that stops once the last of them is seen.

Editing reads activations at one or two early layers of many short prompts (keys, residuals,
statistics); running the remaining layers and the 262k-token unembedding for nothing would cost
most of the time. The pass is ended by an exception raised from the last hook, which no
intervention can observe (the model keeps no state between calls: each uses a fresh KV cache).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from larql.model.hooks import all_hook_names, hook_name
from larql.model.prefix import common_prefix, fork

if TYPE_CHECKING:
    from larql.model.attention import KVCache
    from larql.model.model import Model

F32 = NDArray[np.float32]


class _Enough(Exception):
    """Ends a forward pass early: every activation asked for has been captured."""


def capture(model: Model, ids: Sequence[int], names: Sequence[str]) -> dict[str, F32]:
    """{name: activation `(T, ...)`} at `names` for the prompt `ids`, computing no further than the
    last of them (hook points fire in `all_hook_names` order)."""
    order = {n: i for i, n in enumerate(all_hook_names(model.config.n_layers, (), model.config.n_experts))}
    unknown = [n for n in names if n not in order]
    if unknown:
        raise KeyError(f"unknown hook point {unknown[0]!r}")
    last = max(names, key=order.__getitem__)
    got: dict[str, F32] = {}

    def keep(x: F32, name: str) -> None:
        got[name] = np.array(x, dtype=np.float32, copy=True)
        if name == last:
            raise _Enough

    try:
        model.next_logits(list(ids), hooks={n: keep for n in names})
    except _Enough:
        pass
    return got


BATCH_ROWS = 2048  # packed rows per pass: bounds the activations held at once


class LowerLayers:
    """The residual entering layer `start` of every prompt `capture_batch` has run with it: while no
    layer below `start` changes (an INSERT adds its neurons at `start` and above), a prompt read again
    — at a higher layer, or after a layer's neurons went in — runs from `start`, not from its
    embedding. An INSERT of 1,000 facts over layers 3-8 reads its held prompts and its subjects'
    texts at each of the six layers: 39 layer passes a prompt without this, 24 with it."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.resid: dict[tuple[int, ...], F32] = {}  # token ids -> (T, hidden)


def capture_batch(model: Model, batch: Sequence[Sequence[int]], names: Sequence[str],
                  lower: LowerLayers | None = None) -> list[dict[str, F32]]:
    """`capture` of each id list, in packed passes (`Model.capture_batch`) of up to BATCH_ROWS rows:
    the same activations within float rounding, several times faster for many short prompts. With
    `lower` (and no point below its layer), prompts it has seen run from there, and the others leave
    their residual there in it."""
    runs = [tuple(int(t) for t in ids) for ids in batch]
    layers = [hook_name(n, model.config.n_layers).layer for n in names]
    if lower is None or min(-1 if layer is None else layer for layer in layers) < lower.start:
        return [got for part in _packs(runs) for got in model.capture_batch([list(r) for r in part], names)]
    entry = f"blocks.{lower.start}.hook_resid_pre"
    out: dict[tuple[int, ...], dict[str, F32]] = {}
    new = list(dict.fromkeys(r for r in runs if r not in lower.resid))
    for part in _packs(new):
        for run, got in zip(part, model.capture_batch([list(r) for r in part], [*names, entry])):
            lower.resid[run] = got.pop(entry) if entry not in names else got[entry]
            out[run] = got
    seen = list(dict.fromkeys(r for r in runs if r not in out))
    for part in _packs(seen):
        got_all = model.capture_batch([list(r) for r in part], names, lower.start, [lower.resid[r] for r in part])
        out.update(zip(part, got_all))
    return [out[r] for r in runs]


STEM_MIN = 4  # leading tokens two texts must share for capture_stemmed to run them once


def capture_stemmed(model: Model, batch: Sequence[Sequence[int]], names: Sequence[str]) -> list[dict[str, F32]]:
    """`capture_batch` of texts many of which share their leading tokens (the value step's: the same
    model-written prefix and template words before hundreds of subjects): each shared stem (STEM_MIN
    tokens or more, never a whole text) runs once and its keys and values are forked for the texts
    that follow it, which run only their own rows; the activations are every row's, as
    `capture_batch` gives them."""
    runs = [tuple(int(t) for t in ids) for ids in batch]
    distinct = sorted(set(runs))
    stem = dict.fromkeys(distinct, 0)
    for a, b in itertools.pairwise(distinct):  # sorted: a text's longest shared stem is with a neighbour
        n = common_prefix(a, b)
        if n >= STEM_MIN:
            stem[a], stem[b] = max(stem[a], min(n, len(a) - 1)), max(stem[b], min(n, len(b) - 1))
    heads = sorted({r[: stem[r]] for r in distinct if stem[r] >= STEM_MIN})
    kept: dict[tuple[int, ...], tuple[dict[str, F32], KVCache]] = {}
    for part in _packs(heads):
        caches = [model.new_cache(len(h)) for h in part]
        kept.update(zip(part, zip(model.capture_batch([list(h) for h in part], names, caches=caches), caches)))
    out: dict[tuple[int, ...], dict[str, F32]] = {}
    alone = [r for r in distinct if stem[r] < STEM_MIN]
    for part in _packs(alone):
        out.update(zip(part, model.capture_batch([list(r) for r in part], names)))
    after = [r for r in distinct if stem[r] >= STEM_MIN]
    for part in _packs([r[stem[r]:] for r in after]):
        todo, after = after[: len(part)], after[len(part):]
        forks = [fork(kept[r[: stem[r]]][1], stem[r], len(r)) for r in todo]
        for r, got in zip(todo, model.capture_batch([list(p) for p in part], names, caches=forks)):
            head = kept[r[: stem[r]]][0]
            out[r] = {n: np.concatenate([head[n], got[n]]) for n in names}
    return [out[r] for r in runs]


def _packs(runs: Sequence[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """`runs` in consecutive packs of up to BATCH_ROWS rows (a longer run alone)."""
    packs: list[list[tuple[int, ...]]] = []
    rows = 0
    for run in runs:
        if not packs or rows + len(run) > BATCH_ROWS:
            packs.append([])
            rows = 0
        packs[-1].append(run)
        rows += len(run)
    return packs
