"""Qwen2, Qwen3, Phi-3, GPT-2 and Gemma 2 from GGUF, as llama.cpp's converter lays them out
(rotate-half RoPE with q/k rows in HF order; biases and q/k norms as tensors; Phi-3's q/k/v fused as
`attn_qkv` and its gate and up as `ffn_up`; GPT-2's `attn_qkv`, `ffn_up` for its fully connected
layer, `position_embd`; Gemma's norms stored as 1 + w, its soft-caps as metadata; metadata under the
architecture's prefix): the tiny references of tests/golden/architectures written as GGUF with
gguf-py give transformers' logits."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

import larql
from larql.errors import ModelFormatError, UnsupportedError
from larql.model.config import ModelConfig
from larql.model.gguf_file import GGUFFile
from larql.model.weights import named_tensors
from tests.conftest import rel_err
from tests.synthetic import BYTE_SYMBOLS, VOCAB

REFS = Path(__file__).resolve().parents[1] / "golden" / "architectures"


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter reorders a llama's q/k rows so that rope pairs adjacent elements."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(c: ModelConfig) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter computes it from a llama3 rope_scaling: 1 for the
    high frequencies, the factor for the low ones, a smooth blend between."""
    inv = 1.0 / c.rope_base ** (np.arange(0, c.head_dim, 2, dtype=np.float32) / c.head_dim)
    old, low, high = c.rope_original_context, c.rope_low_freq_factor, c.rope_high_freq_factor
    out = []
    for freq in inv:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(c.rope_factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / c.rope_factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(ref: str, path: Path, stacked: bool = True) -> Path:
    """The reference directory `ref` as a GGUF file at `path` (its architecture's, from config.json;
    Mixtral is a llama with experts, stacked `[E, ...]` as llama.cpp converts it today, or one tensor
    per expert as its older files have them when not `stacked`)."""
    m = larql.load(REFS / ref)
    c = m.config
    arch = "llama" if c.arch == "mixtral" else c.arch
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
    if c.n_experts:
        w.add_uint32("llama.expert_count", c.n_experts)
        w.add_uint32("llama.expert_used_count", c.n_experts_used)
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
        if arch == "llama":
            tensors[b + "attn_q.weight"] = _permute(tensors[b + "attn_q.weight"], c.n_heads)
            tensors[b + "attn_k.weight"] = _permute(tensors[b + "attn_k.weight"], c.n_kv_heads)
        if c.n_experts and stacked:  # (E, ffn, hidden) for gate and up, (E, hidden, ffn) for down
            for part in ("ffn_gate", "ffn_up", "ffn_down"):
                tensors[b + part + "_exps.weight"] = np.stack(
                    [tensors.pop(f"{b}{part}.{e}.weight") for e in range(c.n_experts)])
    if c.rope_scaling == "llama3":  # as llama.cpp's converter writes Llama 3.1's scaling: no metadata, a tensor
        tensors["rope_freqs.weight"] = llama3_rope_factors(c)
    if c.rope_scaling == "longrope":  # as llama.cpp's Phi-3 converter: two factor tensors, the scale as metadata
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", c.rope_original_context)
        scale = c.context_length / c.rope_original_context
        w.add_float32(f"{arch}.rope.scaling.attn_factor", math.sqrt(1 + math.log(scale) / math.log(c.rope_original_context)))
        tensors["rope_factors_long.weight"] = np.array(c.rope_long_factors, dtype=np.float32)
        tensors["rope_factors_short.weight"] = np.array(c.rope_short_factors, dtype=np.float32)
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


def test_phi3_longrope_gguf_matches_transformers(tmp_path: Path) -> None:
    """Phi-3's longrope as llama.cpp stores it (rope_factors_short/long tensors, original context
    and attention factor as metadata) gives transformers' logits in both regimes (prompt 0 is past the
    original context of 32, prompt 1 is not); an inference vindex carries the factors and COMPILE ...
    FORMAT GGUF writes the two tensors back."""
    m = larql.load(write_gguf("phi3_longrope", tmp_path / "l.gguf"))
    hf = larql.load(REFS / "phi3_longrope").config
    # the same config, but for what GGUF stores as float32: eps, the attention factor and the factors
    f32 = ("norm_eps", "rope_attn_factor", "rope_short_factors", "rope_long_factors")
    assert replace(m.config, **{k: getattr(hf, k) for k in f32}) == hf
    for k in f32:
        assert np.array_equal(np.float32(getattr(m.config, k)), np.float32(getattr(hf, k))), k
    want = np.load(REFS / "phi3_longrope.npz")
    for p in (0, 1):
        logits = m.forward(want[f"p{p}.ids"])
        assert rel_err(logits, want[f"p{p}.logits"]) <= 1e-4
        assert np.array_equal(logits.argmax(-1), want[f"p{p}.logits"].argmax(-1))
    from larql.lql.executor import execute
    from larql.vindex.extract import extract

    vx = extract(tmp_path / "l.gguf", tmp_path / "l.vindex", level="inference", dtype="f32")
    assert rel_err(larql.load(vx).dense().forward(want["p0.ids"]), want["p0.logits"]) <= 1e-4
    execute(f'USE "{vx}"; COMPILE CURRENT INTO MODEL "{tmp_path / "back.gguf"}" FORMAT GGUF')
    back = larql.load(tmp_path / "back.gguf")
    assert back.config == m.config
    assert rel_err(back.forward(want["p0.ids"]), want["p0.logits"]) <= 1e-4


def test_longrope_gguf_without_its_metadata_is_refused(tmp_path: Path) -> None:
    path = write_gguf("phi3_longrope", tmp_path / "l.gguf")
    reader = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "phi3")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture",
                                                             "phi3.rope.scaling.original_context_length"):
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), field.types[0], sub)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data).reshape([int(d) for d in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFormatError, match=r"bad\.gguf: rope_factors tensors \(longrope\) need metadata "
                                               r"phi3\.rope\.scaling\.original_context_length, which is missing"):
        larql.load(tmp_path / "bad.gguf")


def test_gemma2_gguf_query_scale_is_llama_cpps(tmp_path: Path) -> None:
    """A GGUF has no query_pre_attn_scalar: the tiny gemma2 reference's 12 (not its head_dim, 8)
    is lost in the file, and larql scales as llama.cpp does, by 1/sqrt(head_dim)."""
    m = larql.load(write_gguf("gemma2", tmp_path / "g.gguf"))
    assert m.config.attn_scale == 8 ** -0.5 and larql.load(REFS / "gemma2").config.attn_scale == 12 ** -0.5


@pytest.mark.parametrize("stacked", [True, False])
def test_mixtral_gguf_matches_transformers(stacked: bool, tmp_path: Path) -> None:
    """Mixtral as llama.cpp stores it: a llama (q/k rows permuted) with expert_count and
    expert_used_count, its experts in 3-D `ffn_*_exps` tensors (read as zero-copy row ranges) or,
    in older files, one tensor per expert."""
    m = larql.load(write_gguf("mixtral", tmp_path / "m.gguf", stacked))
    assert (m.config.arch, m.config.n_experts, m.config.n_experts_used, m.config.rope_interleaved) == ("llama", 4, 2, True)
    assert m.weights.layers[1].experts[2][0].name == ("blk.1.ffn_gate_exps.weight[128:192]" if stacked
                                                      else "blk.1.ffn_gate.2.weight")
    want = np.load(REFS / "mixtral.npz")
    for p in (0, 1):
        logits = m.forward(want[f"p{p}.ids"])
        assert rel_err(logits, want[f"p{p}.logits"]) <= 1e-4
        assert np.array_equal(logits.argmax(-1), want[f"p{p}.logits"].argmax(-1))
    if stacked:  # a vindex stores the experts one tensor each, and runs the same model
        from larql.vindex.extract import extract

        vx = extract(tmp_path / "m.gguf", tmp_path / "m.vindex", level="inference", dtype="f32")
        assert np.array_equal(larql.load(vx).forward(want["p1.ids"]), m.forward(want["p1.ids"]))


def test_mixtral_gguf_with_too_few_experts_is_refused(tmp_path: Path) -> None:
    path = write_gguf("mixtral", tmp_path / "m.gguf")
    meta = dict(GGUFFile(path).metadata)
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "llama")  # the same file claiming 8 experts
    for key in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                "attention.head_count_kv", "context_length"):
        w.add_uint32(f"llama.{key}", meta[f"llama.{key}"])
    w.add_uint32("llama.expert_count", 8)
    w.add_uint32("llama.expert_used_count", 2)
    reader = GGUFFile(path)
    for name in reader.tensors:
        w.add_tensor(name, np.ascontiguousarray(reader.matrix(name).dequantize().reshape(reader.tensors[name].shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFormatError, match=r"bad\.gguf: tensor blk\.0\.ffn_gate_exps\.weight has 256 rows; the "
                                               r"config implies 8 experts x 64"):
        larql.load(tmp_path / "bad.gguf")


def test_llama31_rope_freqs_match_transformers_llama3_scaling(tmp_path: Path) -> None:
    """llama.cpp stores Llama 3.1's rope scaling as `rope_freqs.weight`, one factor per frequency: the
    tiny llama3 reference (original context 64: every band of the scaling occurs) written that way
    gives transformers' logits, and so does a vindex extracted from it (the factors in its config)."""
    from larql.vindex.extract import extract

    m = larql.load(write_gguf("llama3", tmp_path / "l.gguf"))
    assert m.config.rope_scaling == "" and len(m.config.rope_freq_factors) == m.config.head_dim // 2
    f = m.config.rope_freq_factors  # all three bands: kept (1), blended, divided by the factor (8)
    assert f[0] == 1.0 and 1.0 < f[1] < 8.0 and f[-1] == 8.0
    want = np.load(REFS / "llama3.npz")
    for p in (0, 1):
        logits = m.forward(want[f"p{p}.ids"])
        assert rel_err(logits, want[f"p{p}.logits"]) <= 1e-4
        assert np.array_equal(logits.argmax(-1), want[f"p{p}.logits"].argmax(-1))
    vx = larql.load(extract(tmp_path / "l.gguf", tmp_path / "l.vindex", level="inference", dtype="f32"))
    assert vx.config == m.config and np.array_equal(vx.forward(want["p1.ids"]), m.forward(want["p1.ids"]))
    from larql.vindex.verify import verify_vindex

    assert verify_vindex(tmp_path / "l.vindex").config_diffs == []  # the factors as the source has them
    # COMPILE carries the factors back into a GGUF, and refuses a safetensors directory, which has no place for them
    from larql.edit.bake.compile import compile_gguf, compile_safetensors
    from larql.edit.state.view import edit_vindex

    back = larql.load(compile_gguf(edit_vindex(tmp_path / "l.vindex"), tmp_path / "back.gguf").path)
    assert back.config.rope_freq_factors == f and np.array_equal(back.forward(want["p1.ids"]), m.forward(want["p1.ids"]))
    with pytest.raises(UnsupportedError, match=r"safetensors export writes no per-frequency rope factors"):
        compile_safetensors(edit_vindex(tmp_path / "l.vindex"), tmp_path / "hf")
