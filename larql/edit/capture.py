"""Activations at a few hook points, from a forward pass that stops once the last of them is seen.

Editing reads activations at one or two early layers of many short prompts (keys, residuals,
statistics); running the remaining layers and the 262k-token unembedding for nothing would cost
most of the time. The pass is ended by an exception raised from the last hook, which no
intervention can observe (the model keeps no state between calls: each uses a fresh KV cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from larql.model.hooks import all_hook_names

if TYPE_CHECKING:
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


def capture_batch(model: Model, batch: Sequence[Sequence[int]], names: Sequence[str]) -> list[dict[str, F32]]:
    """`capture` of each id list, in packed passes (`Model.capture_batch`) of up to BATCH_ROWS rows:
    the same activations within float rounding, several times faster for many short prompts."""
    out: list[dict[str, F32]] = []
    i = 0
    while i < len(batch):
        j, rows = i, 0
        while j < len(batch) and (j == i or rows + len(batch[j]) <= BATCH_ROWS):
            rows += len(batch[j])
            j += 1
        out += model.capture_batch([list(ids) for ids in batch[i:j]], names)
        i = j
    return out
