"""The patch overlay: per-feature edits held in memory over a read-only vindex. The base files are
never written; editing statements and patch files fill this.

Three kinds of edit, per (layer, feature):
- vector overrides (gate / up / down): the walk FFN substitutes them, so inference changes at once;
- metadata overrides (what the feature is said to write: top token ids and scores): browsing
  (DESCRIBE, SELECT, WALK labels) sees them through `Vindex.down_meta`;
- deletions: the walk FFN silences the feature, browsing and gate KNN no longer return it.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

from larql.errors import VindexError

F32 = NDArray[np.float32]


@dataclass(frozen=True)
class FeatureOverride:
    """Replacement vectors for one feature; None keeps the stored one."""

    gate: F32 | None = None  # (hidden,) the feature's gate vector
    up: F32 | None = None  # (hidden,)
    down: F32 | None = None  # (hidden,) what the feature writes, per unit of activation


@dataclass(frozen=True)
class MetaOverride:
    """What a feature is said to write: token ids and their scores, best first."""

    token_ids: tuple[int, ...]
    scores: tuple[float, ...]


class PatchOverlay:
    """(layer, feature) -> edits, checked against the vindex's shape when set."""

    def __init__(self, num_layers: int, num_features: int, hidden: int) -> None:
        self.num_layers, self.num_features, self.hidden = num_layers, num_features, hidden
        self._features: dict[tuple[int, int], FeatureOverride] = {}
        self._layers: dict[int, dict[int, FeatureOverride]] = {}
        self._meta: dict[tuple[int, int], MetaOverride] = {}
        self._deleted: set[tuple[int, int]] = set()
        self.version = 0  # bumped on every change: readers cache per version

    def __len__(self) -> int:
        """How many features are edited in any way."""
        return len(set(self._features) | set(self._meta) | self._deleted)

    def _check(self, layer: int, feature: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise VindexError(f"layer {layer} is out of range (layers 0-{self.num_layers - 1})")
        if not 0 <= feature < self.num_features:
            raise VindexError(f"feature {feature} is out of range (features 0-{self.num_features - 1})")

    def set_meta(self, layer: int, feature: int, meta: MetaOverride) -> None:
        self._check(layer, feature)
        self._meta[(layer, feature)] = meta
        self._deleted.discard((layer, feature))
        self.version += 1

    def meta(self, layer: int) -> dict[int, MetaOverride]:
        """The metadata overrides of one layer, by feature."""
        return {f: m for (l, f), m in self._meta.items() if l == layer}

    def delete(self, layer: int, feature: int) -> None:
        """Silence a feature: no FFN output, no metadata, not found by KNN."""
        self._check(layer, feature)
        self.remove(layer, feature)
        self._deleted.add((layer, feature))
        self.version += 1

    def deleted(self, layer: int) -> set[int]:
        return {f for (l, f) in self._deleted if l == layer}

    def is_deleted(self, layer: int, feature: int) -> bool:
        return (layer, feature) in self._deleted

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """The (layer, feature) keys with vector overrides, in order."""
        return iter(sorted(self._features))

    def __contains__(self, key: object) -> bool:
        return key in self._features

    def __getitem__(self, key: tuple[int, int]) -> FeatureOverride:
        return self._features[key]

    def set(self, layer: int, feature: int, override: FeatureOverride) -> None:
        self._check(layer, feature)
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
            fixed[part] = np.ascontiguousarray(arr)
        ov = FeatureOverride(**fixed)
        self._features[(layer, feature)] = ov
        self._layers.setdefault(layer, {})[feature] = ov
        self._deleted.discard((layer, feature))
        self.version += 1

    def remove(self, layer: int, feature: int) -> None:
        """Drop every edit of one feature (it reads as the base again)."""
        self._features.pop((layer, feature), None)
        self._layers.get(layer, {}).pop(feature, None)
        self._meta.pop((layer, feature), None)
        self._deleted.discard((layer, feature))
        self.version += 1

    def clear(self) -> None:
        self._features.clear()
        self._layers.clear()
        self._meta.clear()
        self._deleted.clear()
        self.version += 1

    def snapshot(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], tuple]:
        """Every edit of these slots, to put back with `restore` (for trial edits)."""
        return {k: (self._features.get(k), self._meta.get(k), k in self._deleted) for k in keys}

    def restore(self, snap: dict[tuple[int, int], tuple]) -> None:
        for (layer, feature), (vectors, meta, deleted) in snap.items():
            self.remove(layer, feature)
            if vectors is not None:
                self.set(layer, feature, vectors)
            if meta is not None:
                self.set_meta(layer, feature, meta)
            if deleted:
                self.delete(layer, feature)

    def layer(self, layer: int) -> dict[int, FeatureOverride]:
        """The overridden features of one layer (empty when none)."""
        return self._layers.get(layer) or {}

    def update(self, overrides: dict[tuple[int, int], FeatureOverride]) -> None:
        for (layer, feature), ov in overrides.items():
            self.set(layer, feature, ov)
