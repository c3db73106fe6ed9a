"""How a packed pass's rows map to sequences: a batch of prompts runs end to end, not padded
(forward.py), each sequence a `Segment` of the rows with its own KV cache and start position."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from larql.model.attention import KVCache


@dataclass(frozen=True)
class Segment:
    """One sequence of a (packed) pass: rows lo..hi-1 of the activations are its positions
    start..start+(hi-lo)-1, appended to `cache`."""

    lo: int
    hi: int
    cache: KVCache
    start: int


def packed_segments(ids: list[NDArray[np.int64]], caches: list[KVCache]) -> tuple[NDArray[np.int64], list[Segment]]:
    """Sequences packed end to end: the row bounds `(B + 1,)` and each one's segment, after what its
    cache holds."""
    bounds = np.cumsum([0, *(len(a) for a in ids)])
    return bounds, [Segment(int(lo), int(hi), c, c.length) for lo, hi, c in zip(bounds[:-1], bounds[1:], caches)]


def positions(segs: list[Segment]) -> NDArray[np.int64]:
    """Every row's position `(T,)`: each segment counts on from its cache's length."""
    return np.concatenate([np.arange(s.start, s.start + s.hi - s.lo) for s in segs])
