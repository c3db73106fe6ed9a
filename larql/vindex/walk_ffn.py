"""The walk FFN: a layer's FFN computed through the vindex.

A feature's gate score is its gate vector . h (the KNN index is the FFN's first matrix; the scores
are computed from weights.bin's encoding of those rows, of which gate_vectors.bin is the f16/f32
copy, so that the dense walk is the model bit for bit). Features with an override in the patch overlay
(an edited gate / up / down) are substituted; with `top_k`, each position keeps only its k features of
largest |gate score| (a gate KNN) and zeroes the rest. up and down run on the weights' quant blocks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from larql.errors import VindexError
from larql.model.config import ModelConfig
from larql.model.forward import _hook, gated
from larql.model.hooks import layer_hook_names
from larql.model.model import Model
from larql.model.weights import Weights, load_weights
from larql.vindex.overlay import FeatureOverride, PatchOverlay
from larql.vindex.store import Vindex, open_vindex
from larql.vindex.weights import VindexWeightSource

F32 = NDArray[np.float32]


class WalkFFN:
    """A layer's FFN, called by the forward pass as ffn(layer, h, hooks, start) -> (T, hidden)."""

    def __init__(self, vindex: Vindex, cfg: ModelConfig, weights: Weights, top_k: int | None = None,
                 overlay: PatchOverlay | None = None) -> None:
        if vindex.num_layers != cfg.n_layers or vindex.hidden != cfg.hidden:
            raise VindexError(f"{vindex.path}: this vindex does not match the model "
                              f"({vindex.num_layers} layers x {vindex.hidden} vs {cfg.n_layers} x {cfg.hidden})")
        if top_k is not None and top_k < 1:
            raise VindexError(f"walk FFN top_k must be >= 1, got {top_k}")
        self.vindex, self.weights, self.top_k = vindex, weights, top_k
        self.names = layer_hook_names(cfg.n_layers)
        self.overlay = overlay if overlay is not None else vindex.overlay
        self.activation = cfg.activation
        self._downs: dict[int, F32] = {}  # dequantized W_down of layers with an overridden down vector

    def __call__(self, layer: int, h: F32, hooks: object, start: int) -> F32:
        lw, names = self.weights.layers[layer], self.names[layer]
        mine = self.overlay.layer(layer)
        gate = lw.gate.matmul(h)  # (T, ffn) every feature's gate score: its gate vector . h
        for f, ov in mine.items():
            if ov.gate is not None:
                gate[:, f] = h @ ov.gate
        if hooks:
            gate = _hook(hooks, names.mlp_pre, gate, start)  # type: ignore[arg-type]
        up = lw.up.matmul(h)  # (T, ffn)
        for f, ov in mine.items():
            if ov.up is not None:
                up[:, f] = h @ ov.up
        act = gated(self.activation, gate, up)  # (T, ffn)
        gone = self.overlay.deleted(layer)
        if gone:
            act[:, sorted(gone)] = 0.0  # deleted features write nothing
        if self.top_k is not None and self.top_k < act.shape[1]:
            # the gate KNN: keep each position's k features of largest |gate score|
            drop = np.argpartition(-np.abs(gate), self.top_k, axis=1)[:, self.top_k:]  # (T, ffn - k)
            np.put_along_axis(act, drop, 0.0, axis=1)
        if hooks:
            act = _hook(hooks, names.mlp_post, act, start)  # type: ignore[arg-type]
        out = lw.down.matmul(act)  # (T, hidden)
        downs = [(f, ov.down) for f, ov in mine.items() if ov.down is not None]
        if downs:
            if layer not in self._downs:
                self._downs[layer] = lw.down.dequantize()  # (hidden, ffn)
            stored = self._downs[layer]
            for f, down in downs:
                out += np.outer(act[:, f], down - stored[:, f])  # swap the feature's column
        return out


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
    weights = load_weights(VindexWeightSource(vindex.path), cfg)
    walk = WalkFFN(vindex, cfg, weights, top_k, overlay)
    return Model(vindex.index["model"], vindex.path, cfg, weights, vindex.tokenizer, ffn=walk)


def walk_model(vindex_path: str | Path, top_k: int | None = None,
               overrides: dict[tuple[int, int], FeatureOverride] | None = None) -> Model:
    """A model over the vindex at `vindex_path` with its own overlay holding `overrides`."""
    v = open_vindex(vindex_path)
    overlay = PatchOverlay(v.num_layers, int(v.index["intermediate_size"]), v.hidden)
    overlay.update(overrides or {})
    return vindex_model(v, top_k, overlay)
