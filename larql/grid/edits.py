"""A client's FFN edits, carried to a shard: the edit strategy read for the shard's layers into plain
arrays (`snapshot`), and an edit strategy over such a snapshot on the shard (`FrozenEdits`). So a
shard computes the layer as the client's model would, edits included, and never its unedited
weights while the client has edits there."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from larql.model.ffn import FeatureVectors, FFNEdits

F32 = NDArray[np.float32]


@dataclass
class LayerEdits:
    """One layer's edits as FFNEdits reports them, in plain numpy arrays (picklable)."""

    overrides: dict[int, FeatureVectors] = field(default_factory=dict)
    deleted: frozenset[int] = frozenset()
    down_delta: tuple[F32, F32] | None = None
    added: tuple[F32, F32, F32] | None = None

    def empty(self) -> bool:
        return not self.overrides and not self.deleted and self.down_delta is None and self.added is None


@dataclass
class Snapshot:
    """Every edit of some layers, and the walk's top_k: what a shard needs to compute them edited."""

    top_k: int | None
    layers: dict[int, LayerEdits]

    def empty(self) -> bool:
        return self.top_k is None and not self.layers


def _copy(v: F32 | None) -> F32 | None:
    return None if v is None else np.ascontiguousarray(v, dtype=np.float32)


def snapshot(edits: FFNEdits | None, layers: range) -> Snapshot:
    """The edits of `layers` (those with any), read now."""
    if edits is None:
        return Snapshot(None, {})
    out: dict[int, LayerEdits] = {}
    for i in layers:
        le = LayerEdits({int(f): (_copy(g), _copy(u), _copy(d)) for f, (g, u, d) in edits.feature_overrides(i).items()},
                        frozenset(int(f) for f in edits.deleted(i)), edits.down_delta(i), edits.added(i))
        if not le.empty():
            out[i] = le
    return Snapshot(edits.top_k, out)


class FrozenEdits:
    """FFNEdits over a Snapshot: the client's edits as they were when it was taken."""

    def __init__(self, snap: Snapshot) -> None:
        self.top_k, self.layers = snap.top_k, snap.layers
        self._none = LayerEdits()

    def _layer(self, layer: int) -> LayerEdits:
        return self.layers.get(layer, self._none)

    def feature_overrides(self, layer: int) -> Mapping[int, FeatureVectors]:
        return self._layer(layer).overrides

    def deleted(self, layer: int) -> AbstractSet[int]:
        return self._layer(layer).deleted

    def down_delta(self, layer: int) -> tuple[F32, F32] | None:
        return self._layer(layer).down_delta

    def added(self, layer: int) -> tuple[F32, F32, F32] | None:
        return self._layer(layer).added
