"""Named weight handles per layer, from a GGUF file or an HF safetensors directory.

Weights stay in their stored form (quant blocks, f16, bf16, f32) as QuantMatrix views over the
memory map; only the small norm vectors become float32 arrays. Names follow GGUF
(`blk.{L}.attn_q.weight`), the HF source translates to them. Norm vectors follow the GGUF
convention too: Gemma's `(1 + w)` is stored as `w + 1`, so the forward pass always multiplies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelFormatError
from larql.jsonfile import parse_json
from larql.model.config import ModelConfig
from larql.quant import GGMLType, QuantMatrix

Vec = NDArray[np.float32]


class WeightSource(Protocol):
    def has(self, name: str) -> bool: ...
    def matrix(self, name: str) -> QuantMatrix: ...
    def vector(self, name: str) -> Vec: ...


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: Vec
    q: QuantMatrix  # (n_heads * head_dim, hidden)
    k: QuantMatrix  # (n_kv_heads * head_dim, hidden)
    v: QuantMatrix  # (n_kv_heads * head_dim, hidden)
    o: QuantMatrix  # (hidden, n_heads * head_dim)
    ffn_norm: Vec
    gate: QuantMatrix  # (ffn, hidden)
    up: QuantMatrix  # (ffn, hidden)
    down: QuantMatrix  # (hidden, ffn)
    q_bias: Vec | None = None
    k_bias: Vec | None = None
    v_bias: Vec | None = None
    q_norm: Vec | None = None  # (head_dim,)
    k_norm: Vec | None = None
    post_attn_norm: Vec | None = None
    post_ffn_norm: Vec | None = None


@dataclass(frozen=True)
class Weights:
    token_embd: QuantMatrix  # (vocab, hidden)
    output_norm: Vec
    output: QuantMatrix  # (vocab, hidden); token_embd itself when tied
    layers: tuple[LayerWeights, ...]


# LayerWeights field -> GGUF tensor name inside `blk.{L}.`; vectors are the norms and biases
LAYER_TENSORS: dict[str, str] = {
    "attn_norm": "attn_norm.weight", "q": "attn_q.weight", "k": "attn_k.weight", "v": "attn_v.weight",
    "o": "attn_output.weight", "ffn_norm": "ffn_norm.weight", "gate": "ffn_gate.weight",
    "up": "ffn_up.weight", "down": "ffn_down.weight", "q_bias": "attn_q.bias", "k_bias": "attn_k.bias",
    "v_bias": "attn_v.bias", "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "post_attn_norm": "post_attention_norm.weight", "post_ffn_norm": "post_ffw_norm.weight",
}
_MATRICES = ("q", "k", "v", "o", "gate", "up", "down")
_REQUIRED_VECTORS = ("attn_norm", "ffn_norm")


def load_weights(src: WeightSource, cfg: ModelConfig) -> Weights:
    layers = []
    for i in range(cfg.n_layers):
        fields: dict[str, object] = {}
        for field, part in LAYER_TENSORS.items():
            name = f"blk.{i}.{part}"
            if field in _MATRICES:
                fields[field] = src.matrix(name)
            elif field in _REQUIRED_VECTORS or src.has(name):
                fields[field] = src.vector(name)
        layers.append(LayerWeights(**fields))  # type: ignore[arg-type]
    _check_shapes(layers, cfg)
    embd = src.matrix("token_embd.weight")
    output = embd if cfg.tied_embeddings else src.matrix("output.weight")
    return Weights(embd, src.vector("output_norm.weight"), output, tuple(layers))


def named_tensors(weights: Weights) -> Iterator[tuple[str, QuantMatrix | Vec]]:
    """Every tensor under its GGUF name, as stored (matrices) or as float32 (vectors), in file order."""
    yield "token_embd.weight", weights.token_embd
    for i, lw in enumerate(weights.layers):
        for field, part in LAYER_TENSORS.items():
            value = getattr(lw, field)
            if value is not None:
                yield f"blk.{i}.{part}", value
    yield "output_norm.weight", weights.output_norm
    if weights.output is not weights.token_embd:
        yield "output.weight", weights.output


def _check_shapes(layers: list[LayerWeights], cfg: ModelConfig) -> None:
    q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    for i, lw in enumerate(layers):
        expected = {"q": (q_out, cfg.hidden), "k": (kv_out, cfg.hidden), "v": (kv_out, cfg.hidden),
                    "o": (cfg.hidden, q_out), "gate": (cfg.ffn, cfg.hidden), "up": (cfg.ffn, cfg.hidden),
                    "down": (cfg.hidden, cfg.ffn)}
        for field, shape in expected.items():
            m: QuantMatrix = getattr(lw, field)
            if m.shape != shape:
                raise ModelFormatError(f"layer {i}: {m.name} has shape {m.shape}, the config implies {shape}")


# --- HF safetensors directories ---------------------------------------------------------------

_HF_DTYPES = {"F32": GGMLType.F32, "F16": GGMLType.F16, "BF16": GGMLType.BF16}
MAX_SAFETENSORS_HEADER = 100_000_000  # the format's own bound
_ITEM_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _header_entry(path: Path, name: str, entry: object, data_len: int, base: int) -> tuple[str, list[int], int, int]:
    """(dtype, shape, start, end) of one tensor of a safetensors header, checked: a known dtype, a
    shape of non-negative integers, offsets inside the file whose span is exactly the shape's bytes."""
    where = f"{path}: tensor {str(name)[:80]!r}"
    if not isinstance(entry, dict):
        raise ModelFormatError(f"{where}: corrupt safetensors header entry")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _ITEM_SIZE:
        raise ModelFormatError(f"{where}: unknown dtype {str(dtype)[:20]!r}")
    if not isinstance(shape, list) or len(shape) > 8 or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape):
        raise ModelFormatError(f"{where}: shape must be a list of at most 8 non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(
            isinstance(o, int) and not isinstance(o, bool) for o in offsets) or not 0 <= offsets[0] <= offsets[1]:
        raise ModelFormatError(f"{where}: data_offsets must be two integers, start <= end")
    start, end = offsets
    if end > data_len:
        raise ModelFormatError(f"{path}: truncated file: tensor {str(name)[:80]} runs past the end")
    if end - start != int(np.prod(shape, dtype=object)) * _ITEM_SIZE[dtype]:
        raise ModelFormatError(f"{where}: data_offsets span {end - start:,} bytes, not the {shape} {dtype} declared")
    return dtype, shape, base + start, base + end

# GGUF name part -> HF name part, per layer
_HF_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_HF_LAYER_SANDWICH = {"post_attention_norm": "post_attention_layernorm",
                      "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_HF_LAYER_PLAIN = {"ffn_norm": "post_attention_layernorm"}
_HF_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


def hf_tensor_name(name: str, arch: str) -> str:
    """The HF checkpoint name of a GGUF-named tensor: `blk.3.ffn_up.weight` -> `model.layers.3.mlp.up_proj.weight`.

    Raises ValueError for a name that is neither global nor `blk.{L}.part.kind`.
    """
    if name in _HF_GLOBAL:
        return _HF_GLOBAL[name]
    _, layer, part, kind = name.split(".", 3)
    layer_map = _HF_LAYER_SANDWICH if arch == "gemma3" else _HF_LAYER_PLAIN
    return f"model.layers.{layer}.{layer_map.get(part, _HF_LAYER.get(part, part))}.{kind}"


class SafetensorsSource:
    """Every *.safetensors file of a directory, memory-mapped, under GGUF tensor names."""

    def __init__(self, directory: Path, cfg_arch: str, norm_offset: float) -> None:
        self.directory = directory
        self.norm_offset = norm_offset  # Gemma stores w for (1 + w); we keep w + 1
        self.arch = cfg_arch
        self._entries: dict[str, tuple[np.memmap, str, list[int], int, int]] = {}
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise ModelFormatError(f"{directory}: no *.safetensors files")
        for f in files:
            self._index(f)

    def _index(self, path: Path) -> None:
        data = np.memmap(path, dtype=np.uint8, mode="r")
        if len(data) < 8:
            raise ModelFormatError(f"{path}: truncated safetensors file")
        header_len = int(data[:8].view(np.uint64)[0])
        if header_len > MAX_SAFETENSORS_HEADER:
            raise ModelFormatError(f"{path}: a safetensors header of {header_len:,} bytes (more than the format's "
                                   f"{MAX_SAFETENSORS_HEADER:,}): not a safetensors file, or a damaged one")
        if header_len > len(data) - 8:
            raise ModelFormatError(f"{path}: truncated safetensors header")
        try:
            text = data[8:8 + header_len].tobytes().decode()
        except UnicodeDecodeError as e:
            raise ModelFormatError(f"{path}: corrupt safetensors header (not UTF-8: {e.reason})") from None
        header = parse_json(text, f"{path}: safetensors header", 8, "safetensors header", ModelFormatError)
        if not isinstance(header, dict):
            raise ModelFormatError(f"{path}: corrupt safetensors header (not a JSON object)")
        base = 8 + header_len
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            self._entries[name] = (data, *_header_entry(path, name, entry, len(data) - base, base))

    def _hf_name(self, name: str) -> str:
        return hf_tensor_name(name, self.arch)

    def has(self, name: str) -> bool:
        try:
            return self._hf_name(name) in self._entries
        except ValueError:
            return False

    def matrix(self, name: str) -> QuantMatrix:
        hf = self._hf_name(name)
        if hf not in self._entries:
            raise ModelFormatError(f"{self.directory}: missing tensor {hf}")
        data, dtype, shape, start, end = self._entries[hf]
        if dtype not in _HF_DTYPES:
            raise ModelFormatError(f"{self.directory}: tensor {hf} has dtype {dtype}; expected F32, F16 or BF16")
        n_cols = int(shape[-1]) if shape else 1
        n_rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        return QuantMatrix(hf, _HF_DTYPES[dtype], n_rows, n_cols, data[start:end].reshape(n_rows, -1))

    def vector(self, name: str) -> Vec:
        vec = self.matrix(name).dequantize().reshape(-1)
        if name.endswith("norm.weight") and self.norm_offset:
            vec = (vec + np.float32(self.norm_offset)).astype(np.float32)
        return vec
