"""The walk FFN: a layer's FFN computed through the vindex.

Gate scores come from the stored gate vectors (the KNN index is the FFN's first matrix); features
with an override (an edited gate / up / down) are substituted; with `top_k`, each position keeps only
its k features of largest |gate score|. up and down run on the model weights' quant blocks. With no
overrides and no top_k, this is the dense FFN (exactly, up to rounding, when the gate vectors are f32).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from larql.errors import VindexError
from larql.model.forward import _hook, gelu_tanh, silu
from larql.model.model import Model
from larql.vindex.store import Vindex

F32 = NDArray[np.float32]


@dataclass(frozen=True)
class FeatureOverride:
    """Replacement vectors for one feature; None keeps the stored one."""

    gate: F32 | None = None  # (hidden,)
    up: F32 | None = None  # (hidden,)
    down: F32 | None = None  # (hidden,) what the feature writes, per unit of activation


@dataclass
class WalkFFN:
    vindex: Vindex
    model: Model
    top_k: int | None = None
    overrides: dict[tuple[int, int], FeatureOverride] = field(default_factory=dict)
    _gates: dict[int, F32] = field(default_factory=dict, repr=False)
    _downs: dict[int, F32] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        cfg = self.model.config
        if self.vindex.num_layers != cfg.n_layers or self.vindex.hidden != cfg.hidden:
            raise VindexError(f"{self.vindex.path}: this vindex does not match the model "
                              f"({self.vindex.num_layers} layers x {self.vindex.hidden} vs {cfg.n_layers} x {cfg.hidden})")
        if self.top_k is not None and self.top_k < 1:
            raise VindexError(f"walk FFN top_k must be >= 1, got {self.top_k}")
        self.act = gelu_tanh if cfg.activation == "gelu_tanh" else silu

    def gates(self, layer: int) -> F32:
        if layer not in self._gates:
            self._gates[layer] = np.ascontiguousarray(self.vindex.gate_vectors(layer), dtype=np.float32)
        return self._gates[layer]

    def __call__(self, layer: int, h: F32, hooks: object, start: int) -> F32:
        lw = self.model.weights.layers[layer]
        names = self.model._forward.names[layer]
        gate = h @ self.gates(layer).T  # (T, ffn) gate scores from the vindex
        mine = {f: ov for (l, f), ov in self.overrides.items() if l == layer}
        for f, ov in mine.items():
            if ov.gate is not None:
                gate[:, f] = h @ ov.gate
        if hooks:
            gate = _hook(hooks, names.mlp_pre, gate, start)  # type: ignore[arg-type]
        up = lw.up.matmul(h)  # (T, ffn)
        for f, ov in mine.items():
            if ov.up is not None:
                up[:, f] = h @ ov.up
        act = self.act(gate) * up  # (T, ffn)
        if self.top_k is not None and self.top_k < act.shape[1]:
            drop = np.argpartition(-np.abs(gate), self.top_k, axis=1)[:, self.top_k:]
            np.put_along_axis(act, drop, 0.0, axis=1)
        if hooks:
            act = _hook(hooks, names.mlp_post, act, start)  # type: ignore[arg-type]
        out = lw.down.matmul(act)  # (T, hidden)
        if mine:
            if layer not in self._downs:  # (hidden, ffn), only for layers with an overridden feature
                self._downs[layer] = lw.down.dequantize()
            down_cols = self._downs[layer]
            for f, ov in mine.items():
                if ov.down is not None:
                    out += np.outer(act[:, f], ov.down - down_cols[:, f])
        return out


def walk_model(vindex_path: str, top_k: int | None = None,
               overrides: dict[tuple[int, int], FeatureOverride] | None = None) -> Model:
    """The model of an inference-level vindex, its FFN running as the walk FFN."""
    from larql.model.forward import Forward
    from larql.model.load import load
    from larql.vindex.store import open_vindex

    m = load(vindex_path)
    walk = WalkFFN(open_vindex(vindex_path), m, top_k, dict(overrides or {}))
    m._forward = Forward(m.config, m.weights, ffn=walk)
    return m
