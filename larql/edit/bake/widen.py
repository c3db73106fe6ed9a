"""Wider FFN layers for COMPILE: the features METHOD NEURON added to a layer (overlay ids from the
layer's base width up) become real rows of ffn_gate / ffn_up and real columns of ffn_down.

One width for every layer, because the vindex format (one intermediate_size, checked layer by
layer), GGUF (a single `feed_forward_length`) and HF (a single `intermediate_size`) each assume one.
So every dense layer is written W features wide: the base width plus the most features any layer
adds (counted up to its last id, so a removed one's hole counts), rounded up to a multiple of 256 so
that rows of ffn_down, whose length is the width, stay whole blocks of every GGML type (Q8_0 / Q4_0:
32 weights, K-quants: 256). Added feature f goes to row / column f. Every other new slot (holes,
padding, layers that add fewer) is a zero feature: gate row 0, up row 0, down column 0, which is an
exact no-op (act(0) * 0 = 0 for GELU-tanh and SiLU; GPT-2's act(0 + bias 0) = 0 writes 0 too).

A layer with added features is written float32, as COMPILE writes any edited layer; a layer without
keeps its stored blocks with zero blocks appended, which every GGML type decodes to 0.0 (every
scale zero): nothing is requantized.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.edit.patches.overlay import PatchOverlay
from larql.errors import VindexError
from larql.quant import GGMLType, QuantMatrix, row_bytes

ALIGN = 256  # the largest GGML block (K-quants); every other block size divides it
FFN_PARTS = ("ffn_gate", "ffn_up", "ffn_down")
F32 = NDArray[np.float32]


def ffn_width(overlay: PatchOverlay, index: dict[str, Any]) -> int:
    """The FFN width every layer is compiled with: the vindex's intermediate_size when no feature was
    added, else that plus the most any layer adds, rounded up to a multiple of ALIGN."""
    base = int(index["intermediate_size"])
    layers = overlay.added_layers()
    if not layers:
        return base  # nothing added: the layers keep their width (and their bytes)
    if index["model_config"].get("n_experts", 0):
        raise VindexError(f"layers {', '.join(map(str, layers))} have added features (METHOD NEURON), which a "
                          f"mixture-of-experts model cannot hold; remove them before COMPILE")
    most = max(overlay.next_feature(layer) - overlay.widths[layer] for layer in layers)
    return -(-(base + most) // ALIGN) * ALIGN


def ffn_tensor(name: str) -> tuple[int, str, str] | None:
    """(layer, part, "weight" | "bias") of a dense layer's ffn_gate / ffn_up / ffn_down tensor, else None
    (an expert's `blk.L.ffn_gate.e.weight` too: experts are never widened)."""
    bits = name.split(".")
    if len(bits) == 4 and bits[0] == "blk" and bits[2] in FFN_PARTS and bits[3] in ("weight", "bias"):
        return int(bits[1]), bits[2], bits[3]
    return None


def widened(source: Any, name: str, edited: F32 | None, overlay: PatchOverlay, width: int) -> F32 | QuantMatrix | None:
    """Tensor `name` written `width` features wide: float32 values for a layer with added features
    (or already edited, `edited`), the stored blocks zero-padded for any other FFN tensor. `edited`
    as it is (None: as stored) for every tensor the width does not touch: attention, norms, down's
    bias `(hidden,)`, and all of them when nothing was added."""
    part = ffn_tensor(name)
    if part is None:
        return edited
    layer, kind, what = part
    base = overlay.widths[layer]
    if width == base or (kind == "ffn_down" and what == "bias"):
        return edited
    columns = kind == "ffn_down" or what == "bias"  # features along a row: down `(hidden, ffn)`, a bias `(ffn,)`
    added = overlay.added(layer)
    if edited is None and not added:
        return _padded(source.matrix(name), width, columns, what == "bias")
    m = edited if edited is not None else source.matrix(name).dequantize()
    m = np.asarray(m, dtype=np.float32)
    if what == "bias":  # added features have none: their bias is 0
        out = np.zeros(width, np.float32)
        out[:base] = m.reshape(-1)
        return out
    if columns:
        out = np.zeros((m.shape[0], width), np.float32)
        out[:, :base] = m
        for f, ov in added.items():
            out[:, f] = ov.down
        return out
    out = np.zeros((width, m.shape[1]), np.float32)
    out[:base] = m
    field = "up" if kind == "ffn_up" else "gate"  # GPT-2's one FFN matrix is its ffn_gate
    for f, ov in added.items():
        out[f] = getattr(ov, field)
    return out


def widened_shape(name: str, shape: list[int], width: int) -> tuple[int, ...]:
    """The shape `widened` gives tensor `name` of stored `shape`: the feature axis `width` long."""
    part = ffn_tensor(name)
    if part is None or part[1:] == ("ffn_down", "bias"):
        return tuple(shape)
    if part[2] == "bias":
        return (width,)
    return (shape[0], width) if part[1] == "ffn_down" else (width, shape[1])


def _padded(q: QuantMatrix, width: int, columns: bool, vector: bool) -> F32 | QuantMatrix:
    """`q` with zero blocks appended: to every row (`columns`) or as new rows. float32 values for a
    float32 tensor (how compile writes those), the blocks for any other type."""
    if columns:
        extra = np.zeros((q.n_rows, row_bytes(q.qtype, width) - q.raw.shape[1]), np.uint8)
        padded = QuantMatrix(q.name, q.qtype, q.n_rows, width, np.concatenate([q.raw, extra], axis=1))
    else:
        extra = np.zeros((width - q.n_rows, q.raw.shape[1]), np.uint8)
        padded = QuantMatrix(q.name, q.qtype, width, q.n_cols, np.concatenate([q.raw, extra]))
    if q.qtype == GGMLType.F32 or vector:
        values = padded.dequantize()
        return values.reshape(-1) if vector else values
    return padded


def gate_rows(gate: NDArray[np.floating], overlay: PatchOverlay, layer: int, width: int) -> NDArray[np.floating]:
    """gate_vectors.bin's rows of one layer, `width` of them: the added features' gates at their ids
    (in the file's dtype), zero rows elsewhere."""
    if width <= gate.shape[0]:
        return gate
    out = np.zeros((width, gate.shape[1]), gate.dtype)
    out[:gate.shape[0]] = gate
    for f, ov in overlay.added(layer).items():
        out[f] = np.asarray(ov.gate).astype(gate.dtype)
    return out


def zero_rows(a: NDArray[Any], rows: int) -> NDArray[Any]:
    """`a` with zero rows appended up to `rows` (down_meta's empty features)."""
    if rows <= a.shape[0]:
        return a
    return np.concatenate([a, np.zeros((rows - a.shape[0], *a.shape[1:]), a.dtype)])
