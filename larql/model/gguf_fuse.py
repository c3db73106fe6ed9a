"""Per-part tensors back into llama.cpp's fused layout, for COMPILE ... FORMAT GGUF of the
architectures llama.cpp stores fused (model/gguf_fused.py reads them apart): Phi-3's `attn_qkv` (q,
k, v rows) and `ffn_up` (gate rows, then up rows); GPT-2's `attn_qkv` with its bias, and its fully
connected layer, which larql reads as `ffn_gate`, under llama.cpp's name `ffn_up`. Without this a
compiled Phi-3 or GPT-2 GGUF would name tensors neither llama.cpp nor larql look for.

Rows of a quantized tensor are whole blocks, so parts of one type are joined as their stored bytes;
parts of different types (or an edited part, float32) are joined as float32 values."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from larql.quant import GGMLType, QuantMatrix

FUSED = {"phi3": {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_up": ("ffn_gate", "ffn_up")},
         "gpt2": {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_up": ("ffn_gate",)}}


@dataclass(frozen=True)
class OutTensor:
    """A tensor to write: float32 values (an edited or a vector tensor) or stored blocks."""

    name: str
    data: NDArray[np.float32] | QuantMatrix


def _values(t: OutTensor) -> NDArray[np.float32]:
    if isinstance(t.data, QuantMatrix):
        return t.data.dequantize().reshape(t.data.n_rows, t.data.n_cols) if t.data.n_rows > 1 else \
            t.data.dequantize().reshape(-1)
    return t.data


def _join(name: str, parts: list[OutTensor]) -> OutTensor:
    """One tensor of the parts' rows, in order (a vector: their elements)."""
    if len(parts) == 1:
        return OutTensor(name, parts[0].data)
    first = parts[0].data
    if (isinstance(first, QuantMatrix) and first.n_rows > 1 and first.qtype != GGMLType.F32
            and all(isinstance(p.data, QuantMatrix) and p.data.qtype == first.qtype and p.data.n_cols == first.n_cols
                    for p in parts)):
        raws = [p.data.raw for p in parts if isinstance(p.data, QuantMatrix)]
        rows = sum(p.data.n_rows for p in parts if isinstance(p.data, QuantMatrix))
        return OutTensor(name, QuantMatrix(name, first.qtype, rows, first.n_cols, np.concatenate(raws)))
    return OutTensor(name, np.ascontiguousarray(np.concatenate([_values(p) for p in parts]), dtype=np.float32))


def fuse(arch: str, tensors: list[OutTensor]) -> list[OutTensor]:
    """`tensors` in llama.cpp's layout for `arch` (unchanged for an architecture it keeps unfused);
    each fused tensor takes the place of its first part."""
    groups = FUSED.get(arch)
    if not groups:
        return tensors
    part_of = {part: (fused, i) for fused, parts in groups.items() for i, part in enumerate(parts)}
    by_name = {t.name: t for t in tensors}
    out: list[OutTensor] = []
    for t in tensors:
        bits = t.name.split(".")
        if len(bits) != 4 or bits[0] != "blk" or bits[2] not in part_of:
            out.append(t)
            continue
        fused, index = part_of[bits[2]]
        if index == 0:  # the group is written where its first part was
            names = [f"blk.{bits[1]}.{p}.{bits[3]}" for p in groups[fused]]
            out.append(_join(f"blk.{bits[1]}.{fused}.{bits[3]}", [by_name[n] for n in names if n in by_name]))
    return out
