"""Write a model as a Hugging Face directory: config.json, model.safetensors, tokenizer.json,
tokenizer_config.json and generation_config.json, which `transformers` and larql's own HF loader read.

larql keeps tensors under GGUF names and conventions; HF differs in two places, both undone here
exactly as `weights.SafetensorsSource` and llama.cpp's converter apply them:
- llama q/k rows: GGUF permutes each head's rows so rope rotates adjacent pairs (`rope_interleaved`);
  HF rotates halves, so the rows go back: GGUF row h*d + 2i + j is HF row h*d + j*d/2 + i.
- Gemma norms: GGUF (and larql) hold `1 + w`; HF holds `w` and adds the 1 in the forward pass.
Safetensors holds only floats, so quantized blocks are dequantized and stored as f32, f16 or bf16.
The file is streamed a tensor at a time (the header lists every shape up front), so peak memory
is one dequantized tensor. Everything goes to a hidden directory that is renamed into place last.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelError, UnsupportedError
from larql.io.jsonfile import read_json
from larql.io.tempfiles import clean_stale, swap_dir, temp_path
from larql.model.config import ModelConfig
from larql.model.hf_names import SANDWICH_ARCHS, hf_tensor
from larql.model.model import Model
from larql.model.weights import named_tensors
from larql.quant import QuantMatrix
from larql.quant.reference import to_bf16

F32 = NDArray[np.float32]

# larql dtype name -> (safetensors dtype, torch dtype name for config.json)
DTYPES = {"f32": ("F32", "float32"), "f16": ("F16", "float16"), "bf16": ("BF16", "bfloat16")}
_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True)
class ExportTensor:
    """One tensor to write: its GGUF name, shape, and a loader giving float32 values in larql's
    convention (called once, when the tensor's turn comes)."""

    name: str
    shape: tuple[int, ...]
    load: Callable[[], F32]


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer_json: str  # HF tokenizers JSON
    bos_id: int | None
    eos_ids: tuple[int, ...]
    chat_template: str | None = None


def _unpermute(w: F32, n_head: int) -> F32:
    """Inverse of llama.cpp's `permute` (rows of q or k, or their bias)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_hf_values(name: str, x: F32, cfg: ModelConfig) -> F32:
    """A tensor's values in HF convention, from larql's (GGUF) convention."""
    part = name.split(".")[2] if name.startswith("blk.") else ""
    if cfg.rope_interleaved and part == "attn_q":
        return _unpermute(x, cfg.n_heads)
    if cfg.rope_interleaved and part == "attn_k":
        return _unpermute(x, cfg.n_kv_heads)
    if cfg.arch in SANDWICH_ARCHS and name.endswith("norm.weight"):
        return (x - np.float32(1.0)).astype(np.float32)
    return x


def hf_tensors(tensors: Sequence[ExportTensor], cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], Callable[[], F32]]]:
    """(HF checkpoint name, shape, loader of HF-convention values) per tensor written: Mixtral's
    experts as `block_sparse_moe.experts.{e}.w1/w2/w3`, Phi-3's q/k/v rows joined into `qkv_proj`
    and its gate and up into `gate_up_proj`, GPT-2's Conv1D weights transposed and its q/k/v joined
    into `c_attn` (the layout transformers saves and reads)."""
    groups: dict[str, list[tuple[int, ExportTensor]]] = {}
    conv1d: set[str] = set()  # GPT-2's Conv1D tensors, stored (in, out): the transpose of larql's
    for t in tensors:
        where = hf_tensor(t.name, cfg)
        groups.setdefault(where.name, []).append((where.rows[0] if where.rows else 0, t))
        if where.conv1d:
            conv1d.add(where.name)

    def values(t: ExportTensor) -> F32:
        return to_hf_values(t.name, np.asarray(t.load(), np.float32).reshape(t.shape), cfg)

    def joined(parts: list[tuple[int, ExportTensor]], transpose: bool) -> F32:
        x = np.concatenate([values(t) for _, t in parts]) if len(parts) > 1 else values(parts[0][1])
        return np.ascontiguousarray(x.T) if transpose else x

    out: list[tuple[str, tuple[int, ...], Callable[[], F32]]] = []
    for name, parts in groups.items():
        parts.sort(key=lambda p: p[0])
        first_shape = parts[0][1].shape
        row = 0
        for first, t in parts:  # fused parts (q, k, v; gate, up) must tile the tensor's rows
            if first != row or t.shape[1:] != first_shape[1:]:
                raise ModelError(f"{name}: the parts {[p.name for _, p in parts]} do not make one tensor")
            row += t.shape[0]
        shape = (row, *first_shape[1:])
        transpose = name in conv1d and len(shape) == 2
        out.append((name, shape[::-1] if transpose else shape,
                    lambda parts=parts, transpose=transpose: joined(parts, transpose)))  # type: ignore[misc]
    return out


def _rope_parameters(cfg: ModelConfig, base: float, scaled: bool) -> dict[str, Any]:
    """One rope_parameters entry (transformers 5), with the global layers' scaling when `scaled`."""
    if not (scaled and cfg.rope_scaling):
        return {"rope_type": "default", "rope_theta": base}
    out: dict[str, Any] = {"rope_type": cfg.rope_scaling, "rope_theta": base, "factor": cfg.rope_factor}
    if cfg.rope_scaling == "llama3":
        out |= {"low_freq_factor": cfg.rope_low_freq_factor, "high_freq_factor": cfg.rope_high_freq_factor,
                "original_max_position_embeddings": cfg.rope_original_context}
    if cfg.rope_scaling == "longrope":
        out |= {"short_factor": list(cfg.rope_short_factors), "long_factor": list(cfg.rope_long_factors),
                "original_max_position_embeddings": cfg.rope_original_context,
                "attention_factor": cfg.rope_attn_factor}
    return out


def hf_config(cfg: ModelConfig, vocab: int, tok: TokenizerFiles, dtype: str) -> dict[str, Any]:
    """config.json for Gemma3ForCausalLM, Gemma2ForCausalLM, MixtralForCausalLM or LlamaForCausalLM
    (legacy rope keys, which transformers 4.x and larql read, plus v5's rope_parameters)."""
    if cfg.rope_freq_factors:  # nothing below would carry them: refuse, not drop them
        raise UnsupportedError(f"safetensors export writes no per-frequency rope factors (llama.cpp's rope_freqs), "
                               f"which this {cfg.arch} model has; export it as GGUF instead")
    if cfg.n_experts and cfg.arch not in ("llama", "mixtral"):
        raise UnsupportedError(f"safetensors export writes experts only as Mixtral's; this is {cfg.arch}")
    if cfg.arch == "gpt2":
        return _gpt2(cfg, vocab, tok, dtype)
    common: dict[str, Any] = {
        "hidden_size": cfg.hidden, "intermediate_size": cfg.ffn, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "vocab_size": vocab, "max_position_embeddings": cfg.context_length, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_base,
        "rope_scaling": _rope_parameters(cfg, cfg.rope_base, True) if cfg.rope_scaling else None,
        "tie_word_embeddings": cfg.tied_embeddings,
        "attention_dropout": 0.0, "use_cache": True, "torch_dtype": DTYPES[dtype][1], "dtype": DTYPES[dtype][1],
        "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_ids[0] if tok.eos_ids else None,
    }
    if cfg.arch == "gemma3":
        scalar = 1.0 / cfg.attn_scale**2
        layer_types = ["full_attention" if g else "sliding_attention" for g in cfg.global_layers]
        return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", **common,
                "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
                "query_pre_attn_scalar": round(scalar) if abs(scalar - round(scalar)) < 1e-3 else scalar,
                "sliding_window": cfg.sliding_window, "layer_types": layer_types,
                "rope_local_base_freq": cfg.rope_base_local,
                "rope_parameters": {"full_attention": _rope_parameters(cfg, cfg.rope_base, True),
                                    "sliding_attention": _rope_parameters(cfg, cfg.rope_base_local, False)},
                "final_logit_softcapping": cfg.final_softcap or None,
                "attn_logit_softcapping": cfg.attn_softcap or None, "use_bidirectional_attention": False}
    if cfg.arch == "gemma2":
        return _gemma2(cfg, common)
    if cfg.n_experts:  # Mixtral, from an HF directory (arch mixtral) or a GGUF (a llama with experts)
        return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", **common, "hidden_act": "silu",
                "num_local_experts": cfg.n_experts, "num_experts_per_tok": cfg.n_experts_used,
                "sliding_window": cfg.sliding_window or None, "output_router_logits": False,
                "router_aux_loss_coef": 0.0, "router_jitter_noise": 0.0,
                "rope_parameters": _rope_parameters(cfg, cfg.rope_base, True)}
    rope = {"rope_parameters": _rope_parameters(cfg, cfg.rope_base, True)}
    if cfg.arch in ("qwen2", "qwen3"):
        return _qwen(cfg, common | rope)
    if cfg.arch == "phi3":
        return {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", **common, **rope, "hidden_act": "silu",
                "sliding_window": cfg.sliding_window or None, "partial_rotary_factor": 1.0,
                "original_max_position_embeddings": cfg.rope_original_context or cfg.context_length,
                "pad_token_id": None}
    if cfg.arch == "mistral" or (cfg.arch == "llama" and cfg.sliding_window):  # llama.cpp converts Mistral as llama
        if not all(g == (cfg.sliding_window == 0) for g in cfg.global_layers):
            raise UnsupportedError("MistralForCausalLM slides on every layer or none; this model mixes them")
        return {"architectures": ["MistralForCausalLM"], "model_type": "mistral", **common, **rope,
                "hidden_act": "silu", "sliding_window": cfg.sliding_window or None}
    if cfg.arch == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common, **rope, "hidden_act": "silu",
                "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}
    raise UnsupportedError(f"safetensors export knows Gemma 2, Gemma 3, GPT-2, Llama, Mistral, Mixtral, Phi-3, "
                           f"Qwen2 and Qwen3, not {cfg.arch!r}; export it as GGUF instead")


def _gpt2(cfg: ModelConfig, vocab: int, tok: TokenizerFiles, dtype: str) -> dict[str, Any]:
    """GPT2LMHeadModel: GPT-2's own field names; its query scale is 1/sqrt(head_dim) or none."""
    if cfg.attn_scale not in (1.0, cfg.head_dim ** -0.5) or cfg.activation != "gelu_tanh":
        raise UnsupportedError("GPT2LMHeadModel scales queries by 1/sqrt(head_dim) (or not) and uses gelu_new")
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": cfg.hidden, "n_layer": cfg.n_layers,
            "n_head": cfg.n_heads, "n_inner": cfg.ffn, "n_positions": cfg.context_length, "vocab_size": vocab,
            "layer_norm_epsilon": cfg.norm_eps, "activation_function": "gelu_new",
            "scale_attn_weights": cfg.attn_scale != 1.0, "scale_attn_by_inverse_layer_idx": False,
            "tie_word_embeddings": cfg.tied_embeddings, "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
            "use_cache": True, "torch_dtype": DTYPES[dtype][1], "dtype": DTYPES[dtype][1],
            "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_ids[0] if tok.eos_ids else None}


def _qwen(cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
    """Qwen2ForCausalLM / Qwen3ForCausalLM (q/k/v biases and q/k norms are tensors, no flag): a
    sliding window only from layer max_window_layers on, as transformers' use_sliding_window."""
    first = next((i for i, g in enumerate(cfg.global_layers) if not g), cfg.n_layers)
    if any(not g for g in cfg.global_layers[:first]) or any(cfg.global_layers[first:]):
        raise UnsupportedError(f"{cfg.arch}: sliding layers must be the last ones (from max_window_layers on)")
    sliding = first < cfg.n_layers
    return {"architectures": [f"{cfg.arch.capitalize()}ForCausalLM"], "model_type": cfg.arch, **common,
            "hidden_act": "silu", "use_sliding_window": sliding, "max_window_layers": first,
            "sliding_window": cfg.sliding_window if sliding else None,
            "layer_types": ["full_attention" if g else "sliding_attention" for g in cfg.global_layers],
            **({"attention_bias": False} if cfg.arch == "qwen3" else {})}


def _gemma2(cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
    """Gemma2ForCausalLM: every layer's type spelled out (so no version's default pattern is
    assumed), the query scale as query_pre_attn_scalar, both soft-caps (null when off)."""
    if cfg.rope_base_local != cfg.rope_base:
        raise UnsupportedError("Gemma 2 has one rope base; this model's sliding layers use another")
    scalar = 1.0 / cfg.attn_scale**2
    return {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", **common,
            "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
            "query_pre_attn_scalar": round(scalar) if abs(scalar - round(scalar)) < 1e-3 else scalar,
            "sliding_window": cfg.sliding_window,
            "layer_types": ["full_attention" if g else "sliding_attention" for g in cfg.global_layers],
            "rope_parameters": _rope_parameters(cfg, cfg.rope_base, True),
            "final_logit_softcapping": cfg.final_softcap or None, "attn_logit_softcapping": cfg.attn_softcap or None}


def _tokenizer_files(tok: TokenizerFiles, cfg: ModelConfig) -> dict[str, str]:
    """tokenizer.json as it is, and the small JSON files `AutoTokenizer` and `generate` read."""
    vocab = json.loads(tok.tokenizer_json)
    names = {t["id"]: t["content"] for t in vocab.get("added_tokens", [])}
    model_vocab = vocab.get("model", {}).get("vocab", {})
    if isinstance(model_vocab, dict):
        names.update({i: t for t, i in model_vocab.items() if i in (tok.bos_id, *tok.eos_ids)})
    # PreTrainedTokenizerFast runs tokenizer.json unchanged (its post-processor adds BOS where the
    # model wants it); a model-specific class would rebuild that from flags we would have to guess.
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.context_length,
                              "clean_up_tokenization_spaces": False}
    if tok.bos_id is not None and tok.bos_id in names:
        config["bos_token"] = names[tok.bos_id]
    if tok.eos_ids and tok.eos_ids[0] in names:
        config["eos_token"] = names[tok.eos_ids[0]]
    if tok.chat_template:
        config["chat_template"] = tok.chat_template
    generation: dict[str, Any] = {"bos_token_id": tok.bos_id,
                                  "eos_token_id": list(tok.eos_ids) if len(tok.eos_ids) > 1 else
                                  (tok.eos_ids[0] if tok.eos_ids else None)}
    return {"tokenizer.json": tok.tokenizer_json, "tokenizer_config.json": json.dumps(config, indent=2),
            "generation_config.json": json.dumps(generation, indent=2)}


def _encode(x: F32, st_dtype: str) -> bytes:
    if st_dtype == "BF16":
        return to_bf16(x).tobytes()
    return np.ascontiguousarray(x, dtype=np.float16 if st_dtype == "F16" else np.float32).tobytes()


def write_safetensors(path: Path, tensors: Sequence[tuple[str, tuple[int, ...], Callable[[], F32]]],
                      dtype: str) -> None:
    """A safetensors file, streamed: the header (every name, shape and offset) then each tensor's bytes."""
    st_dtype = DTYPES[dtype][0]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, _ in tensors:
        size = int(np.prod(shape)) * _BYTES[st_dtype]
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as the format asks
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, shape, load in tensors:
            data = _encode(load(), st_dtype)
            if len(data) != header[name]["data_offsets"][1] - header[name]["data_offsets"][0]:
                raise ModelError(f"{path}: tensor {name} came out at {len(data)} bytes, not the {shape} declared")
            f.write(data)


def write_hf_dir(out: str | Path, cfg: ModelConfig, tensors: Sequence[ExportTensor], tok: TokenizerFiles,
                 dtype: str = "bf16", overwrite: bool = False) -> Path:
    """Write an HF model directory (atomically: a failure leaves nothing at `out`).

    Args:
        tensors: every tensor under its GGUF name (output.weight absent when embeddings are tied).
        dtype: "f32", "f16" or "bf16" for every tensor of model.safetensors.
    Returns:
        The directory.

    Example:
        >>> write_hf_dir("out", model.config, model_tensors(model), model_tokenizer_files(model))
    """
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r} for safetensors (choose {', '.join(DTYPES)})")
    out = Path(out)
    clean_stale(out)  # what a killed writer of this directory left (a complete old one comes back)
    if out.exists() and not overwrite:
        raise ModelError(f"{out}: already exists; choose another path (or pass --force to replace it)")
    embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise ModelError(f"{out}: the model has no token_embd.weight to export")
    config = hf_config(cfg, embd.shape[0], tok, dtype)
    files = _tokenizer_files(tok, cfg)
    written = hf_tensors(tensors, cfg)
    tmp = temp_path(out)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for name, text in files.items():
            (tmp / name).write_text(text)
        write_safetensors(tmp / "model.safetensors", written, dtype)
        swap_dir(tmp, out)  # an old directory is moved aside first, so a crash loses nothing
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def source_chat_template(source: Path) -> str | None:
    """The chat template a model's source carries (GGUF metadata or an HF tokenizer_config.json), if any."""
    try:
        if source.is_dir():
            cfg = source / "tokenizer_config.json"
            doc = read_json(cfg, 16 << 20, 16, "tokenizer config", ModelError) if cfg.is_file() else None
            template = doc.get("chat_template") if isinstance(doc, dict) else None
            return template if isinstance(template, str) else None
        if source.suffix == ".gguf" and source.is_file():
            from larql.model.gguf_file import GGUFFile

            template = GGUFFile(source).metadata.get("tokenizer.chat_template")
            return str(template) if template else None
    except (OSError, ValueError, ModelError):
        return None  # the template is a convenience; a moved or damaged source leaves it out
    return None


def _constant(value: F32) -> Callable[[], F32]:
    """An ExportTensor loader for a vector the model already holds as float32."""
    return lambda: value


def export_model(model: Model, out: str | Path, dtype: str = "bf16", overwrite: bool = False) -> Path:
    """A loaded model (GGUF, HF directory) as an HF directory; quantized weights are dequantized.

    Example:
        >>> export_model(larql.load("smollm2-135m"), "smollm2-hf", dtype="f32")
    """
    tensors = []
    for name, value in named_tensors(model.weights):
        if isinstance(value, QuantMatrix):
            tensors.append(ExportTensor(name, (value.n_rows, value.n_cols), value.dequantize))
        else:
            tensors.append(ExportTensor(name, (int(value.size),), _constant(value)))
    tok = TokenizerFiles(model.tokenizer.tok.to_str(), model.tokenizer.bos_id, tuple(model.tokenizer.eos_ids),
                         source_chat_template(Path(model.source)))
    return write_hf_dir(out, model.config, tensors, tok, dtype, overwrite)
