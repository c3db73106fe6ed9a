"""The patch overlay: per-feature edits held in memory over a read-only vindex. The base files are
never written; editing statements and patch files fill this.

Three kinds of edit per (layer, feature), and one per layer:
- vector overrides (gate / up / down): the walk FFN substitutes them, so inference changes at once;
- metadata overrides (what the feature is said to write: top token ids and scores): browsing
  (DESCRIBE, SELECT, WALK labels) sees them through `Vindex.down_meta`;
- deletions: the walk FFN silences the feature, browsing and gate KNN no longer return it;
- weight edits (ROME / MEMIT): low-rank additions U V^T to a layer's down projection, which add
  up; the FFN applies their concatenation, and the keys they map are kept so that later edits can
  hold them still.
And features ADDED to a layer (METHOD NEURON): numbered from the layer's base width up, each a whole
(gate, up, down), run by the FFN after the base features (a layer one feature wider per addition).
Editing or deleting one works as for a base feature; a deleted added feature is gone, not silenced.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

import numpy as np
from numpy.typing import NDArray

from larql.edit.patches.delta import LowRankDelta
from larql.errors import VindexError

F32 = NDArray[np.float32]


class FeatureOverride(NamedTuple):
    """Replacement vectors for one feature; None keeps the stored one. A (gate, up, down) tuple, as
    the FFN's edit strategy reads it (model/ffn.py FeatureVectors)."""

    gate: F32 | None = None  # (hidden,) the feature's gate vector
    up: F32 | None = None  # (hidden,)
    down: F32 | None = None  # (hidden,) what the feature writes, per unit of activation


@dataclass(frozen=True)
class MetaOverride:
    """What a feature is said to write: token ids and their scores, best first."""

    token_ids: tuple[int, ...]
    scores: tuple[float, ...]


MAX_ADDED = 1 << 16  # features a layer may gain (ids base width .. base width + MAX_ADDED - 1)


class PatchOverlay:
    """(layer, feature) -> edits, checked against the vindex's shape when set. Stored per layer, so
    the walk FFN's per-layer lookups cost nothing when the layer has no edits. `widths`: each layer's
    base feature count (default `num_features` for all); added features are numbered from it."""

    def __init__(self, num_layers: int, num_features: int, hidden: int, widths: Sequence[int] | None = None) -> None:
        self.num_layers, self.num_features, self.hidden = num_layers, num_features, hidden
        self.widths = list(widths) if widths is not None else [num_features] * num_layers
        if len(self.widths) != num_layers:
            raise VindexError(f"{len(self.widths)} layer widths for {num_layers} layers")
        self._vectors: dict[int, dict[int, FeatureOverride]] = {}
        self._added: dict[int, dict[int, FeatureOverride]] = {}  # layer -> added id -> whole feature
        self._added_joined: dict[int, tuple[F32, F32, F32]] = {}  # layer -> (G, U, D), stacked once
        self._meta: dict[int, dict[int, MetaOverride]] = {}
        self._deleted: dict[int, set[int]] = {}
        self._weights: dict[int, list[LowRankDelta]] = {}
        self._joined: dict[int, tuple[F32, F32, F32]] = {}  # layer -> (U, V, keys), concatenated once
        self.revision = 0  # bumped by every change, so results kept from before one are not reused

    def __len__(self) -> int:
        """How many features are edited (or added) in any way."""
        parts = (self._vectors, self._meta, self._deleted, self._added)
        keys = {(l, f) for part in parts for l, fs in part.items() for f in fs}
        return len(keys)

    def _check(self, layer: int, feature: int, adding: bool = False) -> None:
        """`feature` is a base feature of `layer`, or an added one (`adding`: or one to add)."""
        if not 0 <= layer < self.num_layers:
            raise VindexError(f"layer {layer} is out of range (layers 0-{self.num_layers - 1})")
        width = self.widths[layer]
        if 0 <= feature < width or feature in self._added.get(layer, {}):
            return
        if adding and width <= feature < width + MAX_ADDED:
            return
        added = self._added.get(layer)
        if added and width <= feature < max(added):
            raise VindexError(f"feature {feature} of layer {layer} was added and then removed; it no longer exists")
        # a range, not every id: a layer can hold hundreds of added features and the message stays one line
        more = f", {len(added)} added up to {max(added)}" if added else ""
        raise VindexError(f"feature {feature} is out of range (layer {layer}: features 0-{width - 1}{more}; "
                          f"METHOD NEURON adds features)")

    # -- reading, per layer ---------------------------------------------------------------------

    def layer(self, layer: int) -> dict[int, FeatureOverride]:
        """The features of one layer with vector overrides (empty when none)."""
        return self._vectors.get(layer) or {}

    def meta(self, layer: int) -> dict[int, MetaOverride]:
        """The metadata overrides of one layer, by feature."""
        return self._meta.get(layer) or {}

    def deleted(self, layer: int) -> set[int]:
        return self._deleted.get(layer) or set()

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """The (layer, feature) keys with vector overrides or added, in order."""
        return iter(sorted((l, f) for part in (self._vectors, self._added) for l, fs in part.items() for f in fs))

    def __contains__(self, key: object) -> bool:
        layer, feature = cast(tuple[int, int], key)  # a (layer, feature) pair; anything else raises here
        return feature in self._vectors.get(layer, {}) or feature in self._added.get(layer, {})

    def __getitem__(self, key: tuple[int, int]) -> FeatureOverride:
        added = self._added.get(key[0], {})
        return added[key[1]] if key[1] in added else self._vectors[key[0]][key[1]]

    def added(self, layer: int) -> dict[int, FeatureOverride]:
        """The features added to one layer, by id (ascending), each with gate, up and down."""
        return self._added.get(layer) or {}

    def added_layers(self) -> list[int]:
        return sorted(layer for layer, fs in self._added.items() if fs)

    def next_feature(self, layer: int) -> int:
        """The id the next feature added to `layer` gets: one past the last added, or the base width."""
        added = self._added.get(layer)
        return max(added) + 1 if added else self.widths[layer]

    def added_matrices(self, layer: int) -> tuple[F32, F32, F32] | None:
        """The layer's added features stacked in id order: gate `(n, hidden)`, up `(n, hidden)`, down
        `(hidden, n)` float32, made once per change; None when none were added."""
        added = self._added.get(layer)
        if not added:
            return None
        if layer not in self._added_joined:
            parts = [cast(tuple[F32, F32, F32], added[f]) for f in sorted(added)]  # added ones are whole
            self._added_joined[layer] = (np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts]),
                                         np.ascontiguousarray(np.stack([p[2] for p in parts], axis=1)))
        return self._added_joined[layer]

    # -- editing --------------------------------------------------------------------------------

    def set(self, layer: int, feature: int, override: FeatureOverride) -> None:
        """Override a base feature's vectors, or (an id from the layer's width up) add a feature, which
        needs all of gate, up and down (or replace parts of one added before)."""
        self.revision += 1
        self._check(layer, feature, adding=True)
        fixed = {}
        for part in ("gate", "up", "down"):
            vec = getattr(override, part)
            if vec is None:
                continue
            arr = np.asarray(vec, dtype=np.float32)
            if arr.shape != (self.hidden,):
                raise VindexError(f"override of L{layer} F{feature}: {part} has shape {arr.shape}, "
                                  f"expected ({self.hidden},) (the hidden size)")
            if not np.all(np.isfinite(arr)):
                raise VindexError(f"override of L{layer} F{feature}: {part} has NaN or infinite values")
            fixed[part] = np.array(arr, dtype=np.float32, order="C")  # our own copy: a caller's later write must not edit the model
        if feature >= self.widths[layer]:
            old = self._added.get(layer, {}).get(feature)
            whole = {part: fixed.get(part, getattr(old, part) if old is not None else None) for part in ("gate", "up", "down")}
            missing = [part for part, vec in whole.items() if vec is None]
            if missing:
                raise VindexError(f"L{layer} F{feature} is past the layer's {self.widths[layer]} features: adding it "
                                  f"needs a gate, up and down vector ({', '.join(missing)} missing)")
            self._added.setdefault(layer, {})[feature] = FeatureOverride(**whole)
            self._added[layer] = dict(sorted(self._added[layer].items()))
            self._added_joined.pop(layer, None)
            return
        self._deleted.get(layer, set()).discard(feature)
        self._vectors.setdefault(layer, {})[feature] = FeatureOverride(**fixed)

    def set_meta(self, layer: int, feature: int, meta: MetaOverride) -> None:
        self.revision += 1
        self._check(layer, feature)
        # down_meta rows are u32 ids and f32 scores: anything else would crash a later SELECT
        ids, scores = np.asarray(meta.token_ids), np.asarray(meta.scores, dtype=np.float64)
        if (len(ids) != len(scores) or not len(ids) or ids.dtype.kind not in "iu"
                or ids.min() < 0 or ids.max() >= 1 << 32 or not np.all(np.isfinite(scores))):
            raise VindexError(f"metadata of L{layer} F{feature}: needs as many token ids (0..2^32-1) as finite scores")
        self._deleted.get(layer, set()).discard(feature)
        self._meta.setdefault(layer, {})[feature] = meta

    def delete(self, layer: int, feature: int) -> None:
        """Silence a feature: no FFN output, no metadata, not found by KNN (an added one is removed)."""
        self.revision += 1
        self._check(layer, feature)
        self.remove(layer, feature)
        if feature < self.widths[layer]:
            self._deleted.setdefault(layer, set()).add(feature)

    def remove(self, layer: int, feature: int) -> None:
        """Drop every edit of one feature (a base one reads as the base again, an added one is gone)."""
        self.revision += 1
        for part in (self._vectors, self._meta, self._added):
            part.get(layer, {}).pop(feature, None)
        self._added_joined.pop(layer, None)
        self._deleted.get(layer, set()).discard(feature)

    # -- weight edits, per layer ----------------------------------------------------------------

    def add_weight(self, layer: int, u: F32, v: F32, keys: F32) -> None:
        """Add dW = u v^T to layer `layer`'s down projection (checked: shapes, finite values)."""
        self.revision += 1
        if not 0 <= layer < self.num_layers:
            raise VindexError(f"layer {layer} is out of range (layers 0-{self.num_layers - 1})")
        arrays = [np.array(a, dtype=np.float32, order="C") for a in (u, v, keys)]  # copies, as set() keeps
        r = arrays[0].shape[1] if arrays[0].ndim == 2 else -1
        want = {"u": (self.hidden, r), "v": (self.num_features, r), "keys": (self.num_features, r)}
        for (name, shape), arr in zip(want.items(), arrays):
            if r < 1 or arr.shape != shape:
                raise VindexError(f"weight edit of L{layer}: {name} has shape {arr.shape}, expected {shape}")
            if not np.all(np.isfinite(arr)):
                raise VindexError(f"weight edit of L{layer}: {name} has NaN or infinite values")
        self._weights.setdefault(layer, []).append(LowRankDelta(layer, *arrays))
        self._joined.pop(layer, None)

    def weight_layers(self) -> list[int]:
        return sorted(layer for layer, ws in self._weights.items() if ws)

    def weight_count(self, layer: int | None = None) -> int:
        layers = self.weight_layers() if layer is None else [layer]
        return sum(len(self._weights.get(i, [])) for i in layers)

    def _join(self, layer: int) -> tuple[F32, F32, F32] | None:
        ws = self._weights.get(layer)
        if not ws:
            return None
        if layer not in self._joined:
            u, v, keys = (np.ascontiguousarray(np.concatenate(parts, axis=1))
                          for parts in ([w.u for w in ws], [w.v for w in ws], [w.keys for w in ws]))
            self._joined[layer] = (u, v, keys)
        return self._joined[layer]

    def down_delta(self, layer: int) -> tuple[F32, F32] | None:
        """(U `(hidden, r)`, V `(ffn, r)`): the sum of the layer's weight edits, or None."""
        joined = self._join(layer)
        return None if joined is None else (joined[0], joined[1])

    def held_keys(self, layer: int) -> F32 | None:
        """The keys `(ffn, r)` every weight edit at the layer was solved for, or None."""
        joined = self._join(layer)
        return None if joined is None else joined[2]

    def clear(self) -> None:
        self.revision += 1
        self._weights.clear()
        self._joined.clear()
        self._vectors.clear()
        self._meta.clear()
        self._deleted.clear()
        self._added.clear()
        self._added_joined.clear()

    def update(self, overrides: dict[tuple[int, int], FeatureOverride]) -> None:
        for (layer, feature), ov in overrides.items():
            self.set(layer, feature, ov)

    def snapshot(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], tuple]:
        """Every edit of these slots, to put back with `restore` (for trial edits)."""
        return {(l, f): (self.layer(l).get(f) or self.added(l).get(f), self.meta(l).get(f), f in self.deleted(l))
                for l, f in keys}

    def restore(self, snap: dict[tuple[int, int], tuple]) -> None:
        for (layer, feature), (vectors, meta, deleted) in snap.items():
            self.remove(layer, feature)
            if vectors is not None:
                self.set(layer, feature, vectors)
            if meta is not None:
                self.set_meta(layer, feature, meta)
            if deleted:
                self.delete(layer, feature)
