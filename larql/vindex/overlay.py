"""The patch overlay: per-feature replacements that the walk FFN substitutes, in memory, over a
read-only vindex. The base files are never written; editing statements and patch files fill this."""

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


class PatchOverlay:
    """(layer, feature) -> FeatureOverride, checked against the vindex's shape when set."""

    def __init__(self, num_layers: int, num_features: int, hidden: int) -> None:
        self.num_layers, self.num_features, self.hidden = num_layers, num_features, hidden
        self._features: dict[tuple[int, int], FeatureOverride] = {}
        self._layers: dict[int, dict[int, FeatureOverride]] = {}

    def __len__(self) -> int:
        return len(self._features)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(sorted(self._features))

    def __contains__(self, key: object) -> bool:
        return key in self._features

    def __getitem__(self, key: tuple[int, int]) -> FeatureOverride:
        return self._features[key]

    def set(self, layer: int, feature: int, override: FeatureOverride) -> None:
        if not 0 <= layer < self.num_layers:
            raise VindexError(f"layer {layer} is out of range (layers 0-{self.num_layers - 1})")
        if not 0 <= feature < self.num_features:
            raise VindexError(f"feature {feature} is out of range (features 0-{self.num_features - 1})")
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

    def remove(self, layer: int, feature: int) -> None:
        self._features.pop((layer, feature), None)
        self._layers.get(layer, {}).pop(feature, None)

    def clear(self) -> None:
        self._features.clear()
        self._layers.clear()

    def layer(self, layer: int) -> dict[int, FeatureOverride]:
        """The overridden features of one layer (empty when none)."""
        return self._layers.get(layer) or {}

    def update(self, overrides: dict[tuple[int, int], FeatureOverride]) -> None:
        for (layer, feature), ov in overrides.items():
            self.set(layer, feature, ov)
