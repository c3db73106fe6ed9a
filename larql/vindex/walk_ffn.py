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

from larql.errors import VindexError
from larql.model.config import ModelConfig
from larql.model.ffn import FeatureVectors
from larql.model.model import Model
from larql.model.weights import load_weights
from larql.vindex.overlay import FeatureOverride, PatchOverlay
from larql.vindex.store import Vindex, open_vindex
from larql.vindex.weights import VindexWeightSource

F32 = NDArray[np.float32]


class OverlayEdits:
    """FFNEdits over a PatchOverlay, read live: an edit made to the overlay shows at the next call."""

    def __init__(self, overlay: PatchOverlay, top_k: int | None = None) -> None:
        if top_k is not None and top_k < 1:
            raise VindexError(f"walk FFN top_k must be >= 1, got {top_k}")
        self.overlay, self.top_k = overlay, top_k

    def __len__(self) -> int:
        """How many features the overlay edits."""
        return len(self.overlay)

    def feature_overrides(self, layer: int) -> Mapping[int, FeatureVectors]:
        return self.overlay.layer(layer)  # FeatureOverride is a (gate, up, down) tuple

    def deleted(self, layer: int) -> AbstractSet[int]:
        return self.overlay.deleted(layer)

    def down_delta(self, layer: int) -> tuple[F32, F32] | None:
        return None  # the overlay edits features, not whole matrices


def vindex_model(vindex: Vindex, top_k: int | None = None, overlay: PatchOverlay | None = None) -> Model:
    """The model an inference-level vindex carries, its FFN the walk FFN over `overlay` (default: the
    vindex's own overlay, so edits made through it show up at once)."""
    if not vindex.has_model_weights:
        raise VindexError(f"{vindex.path}: a browse-level vindex has no model weights; "
                          f"re-extract with --level inference to run the model from it")
    mc = dict(vindex.index["model_config"])
    mc["global_layers"] = tuple(mc["global_layers"])
    try:
        cfg = ModelConfig(**mc)
    except TypeError as e:
        raise VindexError(f"{vindex.path / 'index.json'}: model_config does not describe a model this larql "
                          f"runs ({e})") from e
    if vindex.num_layers != cfg.n_layers or vindex.hidden != cfg.hidden:
        raise VindexError(f"{vindex.path}: this vindex does not match the model "
                          f"({vindex.num_layers} layers x {vindex.hidden} vs {cfg.n_layers} x {cfg.hidden})")
    weights = load_weights(VindexWeightSource(vindex.path), cfg)
    edits = OverlayEdits(overlay if overlay is not None else vindex.overlay, top_k)
    return Model(vindex.index["model"], vindex.path, cfg, weights, vindex.tokenizer, edits)


def walk_model(vindex_path: str | Path, top_k: int | None = None,
               overrides: dict[tuple[int, int], FeatureOverride] | None = None) -> Model:
    """A model over the vindex at `vindex_path` with its own overlay holding `overrides`."""
    v = open_vindex(vindex_path)
    overlay = PatchOverlay(v.num_layers, int(v.index["intermediate_size"]), v.hidden)
    overlay.update(overrides or {})
    return vindex_model(v, top_k, overlay)
