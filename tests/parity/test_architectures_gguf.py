"""Qwen2, Qwen3, Phi-3, GPT-2 and Gemma 2 from GGUF, as llama.cpp's converter lays them out
(rotate-half RoPE with q/k rows in HF order; biases and q/k norms as tensors; Phi-3's q/k/v fused as
`attn_qkv` and its gate and up as `ffn_up`; GPT-2's `attn_qkv`, `ffn_up` for its fully connected
layer, `position_embd`; Gemma's norms stored as 1 + w, its soft-caps as metadata; metadata under the
architecture's prefix): the tiny references of tests/golden/architectures written as GGUF with
gguf-py give transformers' logits."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

import larql
from larql.model.weights import named_tensors
from tests.conftest import rel_err
from tests.synthetic import BYTE_SYMBOLS, VOCAB

REFS = Path(__file__).resolve().parents[1] / "golden" / "architectures"


def write_gguf(ref: str, path: Path) -> Path:
    """The reference directory `ref` as a GGUF file at `path` (its architecture's, from config.json)."""
    m = larql.load(REFS / ref)
    c = m.config
    arch = c.arch
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in ((f"{arch}.block_count", c.n_layers), (f"{arch}.embedding_length", c.hidden),
                       (f"{arch}.feed_forward_length", c.ffn), (f"{arch}.attention.head_count", c.n_heads),
                       (f"{arch}.attention.head_count_kv", c.n_kv_heads), (f"{arch}.attention.key_length", c.head_dim),
                       (f"{arch}.attention.value_length", c.head_dim), (f"{arch}.context_length", c.context_length)):
        w.add_uint32(key, value)
    if arch == "gpt2":
        w.add_float32("gpt2.attention.layer_norm_epsilon", c.norm_eps)
    else:
        w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", c.norm_eps)
        w.add_float32(f"{arch}.rope.freq_base", c.rope_base)
    if c.sliding_window:
        w.add_uint32(f"{arch}.attention.sliding_window", c.sliding_window)
    if arch == "gemma2":  # llama.cpp reads the soft-caps, and derives the query scale (no key for it)
        w.add_float32("gemma2.attn_logit_softcapping", c.attn_softcap)
        w.add_float32("gemma2.final_logit_softcapping", c.final_softcap)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(VOCAB)
    w.add_token_types([1] * len(BYTE_SYMBOLS) + [3])
    w.add_token_merges([])
    w.add_eos_token_id(len(VOCAB) - 1)
    w.add_add_bos_token(False)
    tensors = {name: np.asarray(value if isinstance(value, np.ndarray) else value.dequantize(), np.float32)
               for name, value in named_tensors(m.weights)}
    for i in range(c.n_layers):  # fuse as llama.cpp stores them
        b = f"blk.{i}."
        for kind in ("weight", "bias"):
            if arch in ("phi3", "gpt2") and b + "attn_q." + kind in tensors:
                tensors[b + "attn_qkv." + kind] = np.concatenate(
                    [tensors.pop(b + part + "." + kind) for part in ("attn_q", "attn_k", "attn_v")])
        if arch == "phi3":
            gate, up = tensors.pop(b + "ffn_gate.weight"), tensors[b + "ffn_up.weight"]
            tensors[b + "ffn_up.weight"] = np.concatenate([gate, up])  # gate first, as Phi-3's gate_up_proj
        if arch == "gpt2":
            for kind in ("weight", "bias"):
                tensors[b + "ffn_up." + kind] = tensors.pop(b + "ffn_gate." + kind)
    for name, data in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("ref", ["qwen2", "qwen3", "phi3", "gpt2", "gemma2_gguf"])
def test_gguf_matches_transformers(ref: str, tmp_path: Path) -> None:
    m = larql.load(write_gguf(ref, tmp_path / f"{ref}.gguf"))
    arch = m.config.arch
    assert arch == ref.split("_")[0] and m.config.rope_interleaved is False and m.config.qk_norm == (arch == "qwen3")
    hf = larql.load(REFS / ref).config  # the same config, but for eps stored as float32 in GGUF
    assert replace(m.config, norm_eps=hf.norm_eps) == hf and abs(m.config.norm_eps - hf.norm_eps) < 1e-12
    want = np.load(REFS / f"{ref}.npz")
    for p in (0, 1):
        logits = m.forward(want[f"p{p}.ids"])
        assert rel_err(logits, want[f"p{p}.logits"]) <= 1e-4
        assert np.array_equal(logits.argmax(-1), want[f"p{p}.logits"].argmax(-1))
    assert m.tokenize("Bees make honey") == want["p1.ids"].tolist()


def test_gemma2_gguf_query_scale_is_llama_cpps(tmp_path: Path) -> None:
    """A GGUF has no query_pre_attn_scalar: the tiny gemma2 reference's 12 (not its head_dim, 8)
    is lost in the file, and larql scales as llama.cpp does, by 1/sqrt(head_dim)."""
    m = larql.load(write_gguf("gemma2", tmp_path / "g.gguf"))
    assert m.config.attn_scale == 8 ** -0.5 and larql.load(REFS / "gemma2").config.attn_scale == 12 ** -0.5
