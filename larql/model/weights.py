"""Named weight handles per layer, from a GGUF file or an HF safetensors directory.

Weights stay in their stored form (quant blocks, f16, bf16, f32) as QuantMatrix views over the
memory map; only the small norm vectors become float32 arrays. Names follow GGUF
(`blk.{L}.attn_q.weight`), the HF source translates to them. Norm vectors follow the GGUF
convention too: Gemma's `(1 + w)` is stored as `w + 1`, so the forward pass always multiplies.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelFormatError
from larql.io.jsonfile import parse_json
from larql.model.config import ModelConfig
from larql.model.hf_names import HFSlice, hf_candidates, hf_tensor
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
    # (ffn, hidden); GPT-2's c_fc: the matrix whose activation is each feature's. gate, up and down
    # are None in a mixture-of-experts layer, whose FFNs are `experts`
    gate: QuantMatrix | None
    up: QuantMatrix | None  # (ffn, hidden); None for an MLP without a gate (GPT-2)
    down: QuantMatrix | None  # (hidden, ffn)
    q_bias: Vec | None = None
    k_bias: Vec | None = None
    v_bias: Vec | None = None
    q_norm: Vec | None = None  # (head_dim,)
    k_norm: Vec | None = None
    post_attn_norm: Vec | None = None
    post_ffn_norm: Vec | None = None
    o_bias: Vec | None = None  # (hidden,)
    gate_bias: Vec | None = None  # (ffn,)
    up_bias: Vec | None = None
    down_bias: Vec | None = None  # (hidden,)
    attn_norm_bias: Vec | None = None  # LayerNorm's shift (GPT-2)
    ffn_norm_bias: Vec | None = None
    router: QuantMatrix | None = None  # (n_experts, hidden): a mixture of experts' router (Mixtral)
    experts: tuple[tuple[QuantMatrix, QuantMatrix, QuantMatrix], ...] = ()  # per expert (gate, up, down)


@dataclass(frozen=True)
class Weights:
    token_embd: QuantMatrix  # (vocab, hidden)
    output_norm: Vec
    output: QuantMatrix  # (vocab, hidden); token_embd itself when tied
    layers: tuple[LayerWeights, ...]
    output_norm_bias: Vec | None = None  # LayerNorm's shift (GPT-2)
    pos_embd: QuantMatrix | None = None  # (context, hidden) learned absolute positions (GPT-2)


# LayerWeights field -> GGUF tensor name inside `blk.{L}.`; vectors are the norms and biases
LAYER_TENSORS: dict[str, str] = {
    "attn_norm": "attn_norm.weight", "q": "attn_q.weight", "k": "attn_k.weight", "v": "attn_v.weight",
    "o": "attn_output.weight", "ffn_norm": "ffn_norm.weight", "gate": "ffn_gate.weight",
    "up": "ffn_up.weight", "down": "ffn_down.weight", "q_bias": "attn_q.bias", "k_bias": "attn_k.bias",
    "v_bias": "attn_v.bias", "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "post_attn_norm": "post_attention_norm.weight", "post_ffn_norm": "post_ffw_norm.weight",
    "o_bias": "attn_output.bias", "gate_bias": "ffn_gate.bias", "up_bias": "ffn_up.bias", "down_bias": "ffn_down.bias",
    "attn_norm_bias": "attn_norm.bias", "ffn_norm_bias": "ffn_norm.bias",
}
_MATRICES = ("q", "k", "v", "o", "gate", "up", "down")
ROUTER = "ffn_gate_inp.weight"
EXPERT_PARTS = ("ffn_gate", "ffn_up", "ffn_down")
_REQUIRED_VECTORS = ("attn_norm", "ffn_norm")


def load_weights(src: WeightSource, cfg: ModelConfig) -> Weights:
    """Every tensor `cfg` needs from `src`; optional ones (biases, q/k norms, post norms) when present.
    Shapes are checked against the config: a mismatch is one error naming the tensor."""
    layers = []
    for i in range(cfg.n_layers):
        fields: dict[str, object] = {"gate": None, "up": None, "down": None}
        if cfg.n_experts:
            fields["router"] = src.matrix(f"blk.{i}.{ROUTER}")
            fields["experts"] = tuple(tuple(src.matrix(f"blk.{i}.{part}.{e}.weight") for part in EXPERT_PARTS)
                                      for e in range(cfg.n_experts))
        for field, part in LAYER_TENSORS.items():
            name = f"blk.{i}.{part}"
            if (field == "up" and not cfg.gated_mlp) or (cfg.n_experts and field in ("gate", "up", "down")):
                continue
            if field in _MATRICES:
                fields[field] = src.matrix(name)
            elif field in _REQUIRED_VECTORS or src.has(name):
                fields[field] = src.vector(name)
        layers.append(LayerWeights(**fields))  # type: ignore[arg-type]
    embd = src.matrix("token_embd.weight")
    output = embd if cfg.tied_embeddings else src.matrix("output.weight")
    weights = Weights(embd, src.vector("output_norm.weight"), output, tuple(layers),
                      src.vector("output_norm.bias") if src.has("output_norm.bias") else None,
                      src.matrix("position_embd.weight") if cfg.positions == "learned" else None)
    _check_shapes(weights, cfg, str(getattr(src, "directory", getattr(src, "path", "the model"))))
    return weights


def named_tensors(weights: Weights) -> Iterator[tuple[str, QuantMatrix | Vec]]:
    """Every tensor under its GGUF name, as stored (matrices) or as float32 (vectors), in file order."""
    yield "token_embd.weight", weights.token_embd
    if weights.pos_embd is not None:
        yield "position_embd.weight", weights.pos_embd
    for i, lw in enumerate(weights.layers):
        for field, part in LAYER_TENSORS.items():
            value = getattr(lw, field)
            if value is not None:
                yield f"blk.{i}.{part}", value
        if lw.router is not None:
            yield f"blk.{i}.{ROUTER}", lw.router
        for e, mats in enumerate(lw.experts):
            for part, m in zip(EXPERT_PARTS, mats):
                yield f"blk.{i}.{part}.{e}.weight", m
    yield "output_norm.weight", weights.output_norm
    if weights.output_norm_bias is not None:
        yield "output_norm.bias", weights.output_norm_bias
    if weights.output is not weights.token_embd:
        yield "output.weight", weights.output


# How much float32 `float32_copies` may hold: a model of ~500M parameters (gemma3-270m's take 1.07 GB)
FLOAT32_COPIES_BYTES = 2 << 30


def float32_copies(weights: Weights, max_bytes: int = FLOAT32_COPIES_BYTES) -> list[NDArray[np.float32]]:
    """Every matrix's float32 copy (`QuantMatrix.dense`), for a caller to hold while it makes many
    batched passes: while held, those passes read them instead of dequantizing a chunk of weights
    per call. Empty when together they would take more than `max_bytes` (larger models)."""
    # the embeddings are read a few rows at a time (`rows`), never from a float32 copy: only as the lm_head
    matrices = {id(m): m for name, m in named_tensors(weights) if isinstance(m, QuantMatrix)
                and (name not in ("token_embd.weight", "position_embd.weight") or m is weights.output)}
    if sum(m.n_rows * m.n_cols * 4 for m in matrices.values()) > max_bytes:
        return []
    return [m.dense() for m in matrices.values()]


def _check_shapes(w: Weights, cfg: ModelConfig, where: str) -> None:
    q_out, kv_out, h, f = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.hidden, cfg.ffn
    matrices = {"q": (q_out, h), "k": (kv_out, h), "v": (kv_out, h), "o": (h, q_out), "gate": (f, h),
                "up": (f, h), "down": (h, f)}
    vectors = {"attn_norm": h, "ffn_norm": h, "q_bias": q_out, "k_bias": kv_out, "v_bias": kv_out,
               "q_norm": cfg.head_dim, "k_norm": cfg.head_dim, "post_attn_norm": h, "post_ffn_norm": h,
               "o_bias": h, "gate_bias": f, "up_bias": f, "down_bias": h, "attn_norm_bias": h, "ffn_norm_bias": h}

    def bad(name: str, shape: tuple[int, ...], want: tuple[int, ...]) -> ModelFormatError:
        return ModelFormatError(f"{where}: tensor {name} has shape {list(shape)}, the config implies {list(want)}; "
                                f"check config.json against the weights")

    for i, lw in enumerate(w.layers):
        for field, shape in matrices.items():
            m: QuantMatrix | None = getattr(lw, field)
            if m is not None and m.shape != shape:
                raise bad(m.name, m.shape, shape)
        if lw.router is not None and lw.router.shape != (cfg.n_experts, h):
            raise bad(lw.router.name, lw.router.shape, (cfg.n_experts, h))
        for gate, up, down in lw.experts:
            for m, shape in ((gate, (f, h)), (up, (f, h)), (down, (h, f))):
                if m.shape != shape:
                    raise bad(m.name, m.shape, shape)
        for field, n in vectors.items():
            v: Vec | None = getattr(lw, field)
            if v is not None and v.shape != (n,):
                raise bad(f"blk.{i}.{LAYER_TENSORS[field]}", v.shape, (n,))
    if w.token_embd.n_cols != h or w.output.n_cols != h:
        m = w.token_embd if w.token_embd.n_cols != h else w.output
        raise bad(m.name, m.shape, (m.n_rows, h))
    if w.output_norm.shape != (h,):
        raise bad("output_norm.weight", w.output_norm.shape, (h,))
    if w.pos_embd is not None and (w.pos_embd.n_cols != h or w.pos_embd.n_rows < cfg.context_length):
        raise bad(w.pos_embd.name, w.pos_embd.shape, (cfg.context_length, h))


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


SafetensorsEntry = tuple[np.memmap, str, list[int], int, int]  # (file map, dtype, shape, start, end)


def read_safetensors_index(path: Path) -> dict[str, SafetensorsEntry]:
    """Every tensor of one safetensors file, memory-mapped: name -> (map, dtype, shape, start, end),
    the header checked (size, UTF-8 JSON, each entry's dtype, shape and offsets)."""
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
    return {name: (data, *_header_entry(path, name, entry, len(data) - base, base))
            for name, entry in header.items() if name != "__metadata__"}


# checkpoint entries that are not weights: GPT-2's causal-mask buffers, stale rotary tables
_NOT_WEIGHTS = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


class SafetensorsSource:
    """Every *.safetensors file of a directory, memory-mapped, under GGUF tensor names."""

    def __init__(self, directory: Path, cfg: ModelConfig, norm_offset: float) -> None:
        self.directory = directory
        self.norm_offset = norm_offset  # Gemma stores w for (1 + w); we keep w + 1
        self.cfg = cfg
        self.used: set[str] = set()
        self._entries: dict[str, SafetensorsEntry] = {}
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise ModelFormatError(f"{directory}: no *.safetensors files")
        for f in files:
            self._entries.update(read_safetensors_index(f))

    def _find(self, name: str) -> HFSlice | None:
        """The stored slice of GGUF-named `name`, None if the checkpoint lacks it (GPT-2
        checkpoints may omit the `transformer.` prefix)."""
        try:
            candidates = hf_candidates(name, self.cfg)
        except ValueError:
            return None
        return next((where for where in candidates if where.name in self._entries), None)

    def has(self, name: str) -> bool:
        return self._find(name) is not None

    def matrix(self, name: str) -> QuantMatrix:
        where = self._find(name)
        if where is None:
            raise ModelFormatError(f"{self.directory}: missing tensor {hf_tensor(name, self.cfg).name}")
        self.used.add(where.name)
        data, dtype, shape, start, end = self._entries[where.name]
        if dtype not in _HF_DTYPES:
            raise ModelFormatError(f"{self.directory}: tensor {where.name} has dtype {dtype}; "
                                   f"expected F32, F16 or BF16")
        n_cols = int(shape[-1]) if shape else 1
        n_rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        m = QuantMatrix(where.name, _HF_DTYPES[dtype], n_rows, n_cols, data[start:end].reshape(n_rows, -1))
        if where.conv1d:  # (in, out) -> (out, in): one float32 copy, small next to a Linear model's mmap
            t = np.ascontiguousarray(m.dequantize().T)
            m = QuantMatrix(where.name, GGMLType.F32, t.shape[0], t.shape[1], t.view(np.uint8))
        if where.rows is not None:
            a, b = where.rows
            if len(shape) == 1:  # a fused bias: its elements are the rows
                size = m.raw.shape[1] // n_cols  # bytes per element (F32, F16, BF16)
                return QuantMatrix(f"{where.name}[{a}:{b}]", m.qtype, 1, b - a, m.raw[:, a * size:b * size])
            if b > m.n_rows:
                raise ModelFormatError(f"{self.directory}: tensor {where.name} has {m.n_rows} rows; the config "
                                       f"implies at least {b} (fused q/k/v or gate/up)")
            return QuantMatrix(f"{where.name}[{a}:{b}]", m.qtype, b - a, m.n_cols, m.raw[a:b])
        return m

    def vector(self, name: str) -> Vec:
        vec = self.matrix(name).dequantize().reshape(-1)
        if name.endswith("norm.weight") and self.norm_offset:
            vec = (vec + np.float32(self.norm_offset)).astype(np.float32)
        return vec

    def unused(self) -> list[str]:
        """Checkpoint tensors no part of the model read (besides mask buffers): each would be ignored."""
        return [n for n in self._entries if n not in self.used and not n.endswith(_NOT_WEIGHTS)]
