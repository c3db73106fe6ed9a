"""The walk FFN: a vindex's patch overlay as the FFN's edit strategy (model/ffn.py).

A feature's gate score is its gate vector . h (the KNN index is the FFN's first matrix; the scores
are computed from weights.bin's encoding of those rows, of which gate_vectors.bin is the f16/f32
copy, so that the walk with no edits is the dense model bit for bit). Features with an override in
the overlay (an edited gate / up / down) are substituted, deleted features write nothing; with
`top_k`, each position keeps only its k features of largest |gate score| (a gate KNN).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from larql.edit.patches.overlay import FeatureOverride, PatchOverlay
from larql.errors import VindexError
from larql.model.ffn import FeatureVectors
from larql.model.model import Model
from larql.vindex.runtime import carried_model
from larql.vindex.store import open_vindex

F32 = NDArray[np.float32]


class OverlayEdits:
    """FFNEdits over a PatchOverlay, read live: an edit made to the overlay shows at the next call."""

    def __init__(self, overlay: PatchOverlay, top_k: int | None = None) -> None:
        if top_k is not None and top_k < 1:
            raise VindexError(f"walk FFN top_k must be >= 1, got {top_k}")
        self.overlay, self.top_k = overlay, top_k

    @property
    def revision(self) -> int:
        """The overlay's change count (model/prefix.py reuses kept KV caches only while it holds)."""
        return self.overlay.revision

    def __len__(self) -> int:
        """How many features the overlay edits."""
        return len(self.overlay)

    def feature_overrides(self, layer: int) -> Mapping[int, FeatureVectors]:
        return self.overlay.layer(layer)  # FeatureOverride is a (gate, up, down) tuple

    def deleted(self, layer: int) -> AbstractSet[int]:
        return self.overlay.deleted(layer)

    def down_delta(self, layer: int) -> tuple[F32, F32] | None:
        return self.overlay.down_delta(layer)  # ROME / MEMIT weight edits

    def added(self, layer: int) -> tuple[F32, F32, F32] | None:
        return self.overlay.added_matrices(layer)  # METHOD NEURON's features


def walk_model(vindex_path: str | Path, top_k: int | None = None,
               overrides: dict[tuple[int, int], FeatureOverride] | None = None) -> Model:
    """A model over the vindex at `vindex_path`, its FFN the walk over a fresh overlay holding
    `overrides` (for experiments and benchmarks; LQL and `larql.load` go through EditableVindex)."""
    v = open_vindex(vindex_path)
    overlay = PatchOverlay(v.num_layers, max(v.num_features(layer) for layer in range(v.num_layers)), v.hidden)
    overlay.update(overrides or {})
    return carried_model(v, OverlayEdits(overlay, top_k))
