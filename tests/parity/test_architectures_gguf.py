"""Qwen2 and Qwen3 from GGUF, as llama.cpp's converter lays them out (rotate-half RoPE with q/k rows
in HF order, q/k/v biases and q/k norms as tensors, metadata under the architecture's prefix): the
tiny references of tests/golden/architectures written as GGUF with gguf-py give transformers' logits."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import larql
from larql.model.weights import named_tensors
from tests.conftest import rel_err
from tests.synthetic import BYTE_SYMBOLS, VOCAB

REFS = Path(__file__).resolve().parents[1] / "golden" / "architectures"


def write_gguf(arch: str, path: Path) -> Path:
    m = larql.load(REFS / arch)
    c = m.config
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in ((f"{arch}.block_count", c.n_layers), (f"{arch}.embedding_length", c.hidden),
                       (f"{arch}.feed_forward_length", c.ffn), (f"{arch}.attention.head_count", c.n_heads),
                       (f"{arch}.attention.head_count_kv", c.n_kv_heads), (f"{arch}.attention.key_length", c.head_dim),
                       (f"{arch}.attention.value_length", c.head_dim), (f"{arch}.context_length", c.context_length)):
        w.add_uint32(key, value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", c.norm_eps)
    w.add_float32(f"{arch}.rope.freq_base", c.rope_base)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(VOCAB)
    w.add_token_types([1] * len(BYTE_SYMBOLS) + [3])
    w.add_token_merges([])
    w.add_eos_token_id(len(VOCAB) - 1)
    w.add_add_bos_token(False)
    for name, value in named_tensors(m.weights):
        data = value if isinstance(value, np.ndarray) else value.dequantize()
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_gguf_matches_transformers(arch: str, tmp_path: Path) -> None:
    m = larql.load(write_gguf(arch, tmp_path / f"{arch}.gguf"))
    assert m.config.arch == arch and m.config.rope_interleaved is False and m.config.qk_norm == (arch == "qwen3")
    ref = np.load(REFS / f"{arch}.npz")
    for p in (0, 1):
        logits = m.forward(ref[f"p{p}.ids"])
        assert rel_err(logits, ref[f"p{p}.logits"]) <= 1e-4
        assert np.array_equal(logits.argmax(-1), ref[f"p{p}.logits"].argmax(-1))
    assert m.tokenize("Bees make honey") == ref["p1.ids"].tolist()
