"""GGUF files whose tensors llama.cpp stores fused: Phi-3 (`attn_qkv`, and `ffn_up` holding gate then
up), GPT-2 (`attn_qkv` with its bias; `ffn_up` is the fully connected layer, which larql reads as
`ffn_gate`, and there is no up projection) and a mixture of experts (Mixtral: every expert's gate,
up and down stacked in the 3-D `ffn_gate_exps` / `ffn_up_exps` `[E, ffn, hidden]` and `ffn_down_exps`
`[E, hidden, ffn]`). `FusedGGUF` answers larql's per-part names (`blk.L.ffn_gate.{e}.weight` for
expert e) with row ranges of the fused tensors: zero-copy views, whatever the quant type (rows are
whole blocks)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelFormatError
from larql.model.config import ModelConfig
from larql.model.gguf_file import GGUFFile
from larql.quant import QuantMatrix

FUSED_ARCHS = ("phi3", "gpt2")
_EXPERTS = {"ffn_gate": "ffn_gate_exps", "ffn_up": "ffn_up_exps", "ffn_down": "ffn_down_exps"}


def is_fused(gguf: GGUFFile, cfg: ModelConfig) -> bool:
    """Whether `gguf` stores some of the tensors larql names separately fused (else it is read as is;
    llama.cpp's older Mixtral files have one tensor per expert, as larql names them)."""
    return cfg.arch in FUSED_ARCHS or (cfg.n_experts > 0 and gguf.has("blk.0.ffn_gate_exps.weight"))


class FusedGGUF:
    """A GGUFFile seen under larql's unfused tensor names."""

    def __init__(self, gguf: GGUFFile, cfg: ModelConfig) -> None:
        self.gguf, self.cfg, self.path = gguf, cfg, gguf.path
        q, kv, f = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.ffn
        # part -> (fused part, first row, last row)
        self.parts: dict[str, tuple[str, int, int]] = {
            "attn_q": ("attn_qkv", 0, q), "attn_k": ("attn_qkv", q, q + kv), "attn_v": ("attn_qkv", q + kv, q + 2 * kv)}
        if cfg.n_experts:  # Mixtral: q/k/v are separate; only the experts are fused
            self.parts = {}
        elif cfg.arch == "phi3":
            self.parts |= {"ffn_gate": ("ffn_up", 0, f), "ffn_up": ("ffn_up", f, 2 * f)}
        else:  # gpt2: the fully connected layer is the gate's part; nothing plays the up's
            self.parts |= {"ffn_gate": ("ffn_up", 0, f), "ffn_up": ("", 0, 0)}

    def _where(self, name: str) -> tuple[str, int, int] | None:
        parts = name.split(".")
        if len(parts) == 5 and parts[0] == "blk" and parts[2] in _EXPERTS and parts[3].isdigit() and self.cfg.n_experts:
            e, rows = int(parts[3]), self.cfg.hidden if parts[2] == "ffn_down" else self.cfg.ffn
            return (f"blk.{parts[1]}.{_EXPERTS[parts[2]]}.{parts[4]}", e * rows, (e + 1) * rows)
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in self.parts:
            fused, a, b = self.parts[parts[2]]
            return (f"blk.{parts[1]}.{fused}.{parts[3]}", a, b) if fused else None
        return (name, -1, -1)

    def has(self, name: str) -> bool:
        where = self._where(name)
        return where is not None and self.gguf.has(where[0])

    def matrix(self, name: str) -> QuantMatrix:
        where = self._where(name)
        m = self.gguf.matrix(where[0] if where is not None else name)
        if where is None or where[1] < 0:
            return m
        _, a, b = where
        if m.name.endswith("_exps.weight") and m.n_rows != self.cfg.n_experts * (b - a):
            raise ModelFormatError(f"{self.path}: tensor {m.name} has {m.n_rows} rows; the config implies "
                                   f"{self.cfg.n_experts} experts x {b - a}")
        if m.n_rows == 1:  # a fused bias: its elements are the rows
            size = m.raw.shape[1] // m.n_cols
            return QuantMatrix(f"{m.name}[{a}:{b}]", m.qtype, 1, b - a, m.raw[:, a * size:b * size])
        return QuantMatrix(f"{m.name}[{a}:{b}]", m.qtype, b - a, m.n_cols, m.raw[a:b])

    def vector(self, name: str) -> NDArray[np.float32]:
        return self.matrix(name).dequantize().reshape(-1)
