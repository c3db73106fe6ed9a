"""ModelConfig: everything the forward pass needs to know, from GGUF metadata or an HF config.json.

One frozen dataclass covers every supported architecture; each architecture is a small function
filling it in. Adding Qwen2 or Mistral means one more entry in ARCHITECTURES (and, for HF
directories, in HF_MODEL_TYPES): the forward pass already handles q/k/v biases, GQA, sliding
windows and both rope layouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from larql.errors import ModelFormatError, UnsupportedError


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # "gemma3" | "llama"
    n_layers: int
    hidden: int
    ffn: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    context_length: int
    norm_eps: float
    rope_base: float  # global (full-attention) layers
    rope_base_local: float  # sliding-window layers
    rope_interleaved: bool  # rotate (x[2i], x[2i+1]) pairs (GGUF llama) instead of (x[i], x[i+d/2])
    sliding_window: int  # 0: no sliding window
    global_layers: tuple[bool, ...]  # per layer: full attention (True) or sliding window (False)
    embed_scale: float  # embeddings are multiplied by this (Gemma: sqrt(hidden))
    attn_scale: float  # query scaling before the softmax
    qk_norm: bool  # RMSNorm on each head's q and k (Gemma 3)
    sandwich_norms: bool  # post-attention and post-FFN norms (Gemma 2/3)
    activation: str  # "gelu_tanh" | "silu"
    final_softcap: float  # 0: none
    attn_softcap: float  # 0: none
    tied_embeddings: bool

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base if self.global_layers[layer] else self.rope_base_local

    def layer_window(self, layer: int) -> int:
        return 0 if self.global_layers[layer] else self.sliding_window


def _need(meta: dict[str, Any], key: str, source: str) -> Any:
    if key not in meta:
        raise ModelFormatError(f"{source}: missing metadata key {key}")
    return meta[key]


def _gemma3(meta: dict[str, Any], source: str, tied: bool) -> ModelConfig:
    p = "gemma3."
    n_layers = int(_need(meta, p + "block_count", source))
    hidden = int(_need(meta, p + "embedding_length", source))
    head_dim = int(meta.get(p + "attention.key_length", 256))
    # llama.cpp's Gemma 3 rules, not stored in the GGUF: every 6th layer is global, local layers use
    # rope base 10,000, queries are scaled by 1/sqrt(head_dim).
    pattern = int(meta.get(p + "attention.sliding_window_pattern", 6))
    return ModelConfig(
        arch="gemma3", n_layers=n_layers, hidden=hidden,
        ffn=int(_need(meta, p + "feed_forward_length", source)),
        n_heads=int(_need(meta, p + "attention.head_count", source)),
        n_kv_heads=int(meta.get(p + "attention.head_count_kv", 1)),
        head_dim=head_dim, vocab=int(meta.get(p + "vocab_size", 0)),
        context_length=int(meta.get(p + "context_length", 32768)),
        norm_eps=float(meta.get(p + "attention.layer_norm_rms_epsilon", 1e-6)),
        rope_base=float(meta.get(p + "rope.freq_base", 1_000_000.0)),
        rope_base_local=float(meta.get(p + "rope.freq_base_swa", 10_000.0)),
        rope_interleaved=False,
        sliding_window=int(meta.get(p + "attention.sliding_window", 512)),
        global_layers=tuple((i + 1) % pattern == 0 for i in range(n_layers)),
        embed_scale=math.sqrt(hidden),
        attn_scale=float(meta.get(p + "attention.scale", head_dim ** -0.5)),
        qk_norm=True, sandwich_norms=True, activation="gelu_tanh",
        final_softcap=float(meta.get(p + "final_logit_softcapping", 0.0)),
        attn_softcap=float(meta.get(p + "attn_logit_softcapping", 0.0)),
        tied_embeddings=tied,
    )


def _llama(meta: dict[str, Any], source: str, tied: bool) -> ModelConfig:
    arch = str(meta["general.architecture"])
    p = arch + "."
    n_layers = int(_need(meta, p + "block_count", source))
    hidden = int(_need(meta, p + "embedding_length", source))
    n_heads = int(_need(meta, p + "attention.head_count", source))
    head_dim = int(meta.get(p + "attention.key_length", hidden // n_heads))
    window = int(meta.get(p + "attention.sliding_window", 0))
    return ModelConfig(
        arch=arch, n_layers=n_layers, hidden=hidden,
        ffn=int(_need(meta, p + "feed_forward_length", source)),
        n_heads=n_heads, n_kv_heads=int(meta.get(p + "attention.head_count_kv", n_heads)),
        head_dim=head_dim, vocab=int(meta.get(p + "vocab_size", 0)),
        context_length=int(meta.get(p + "context_length", 4096)),
        norm_eps=float(meta.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(meta.get(p + "rope.freq_base", 10_000.0)),
        rope_base_local=float(meta.get(p + "rope.freq_base", 10_000.0)),
        # llama.cpp's converter permutes llama q/k rows so that rope rotates adjacent pairs
        rope_interleaved=bool(meta.get("larql.rope_interleaved", arch == "llama")),
        sliding_window=window, global_layers=tuple(window == 0 for _ in range(n_layers)),
        embed_scale=1.0, attn_scale=head_dim ** -0.5,
        qk_norm=False, sandwich_norms=False, activation="silu",
        final_softcap=0.0, attn_softcap=0.0, tied_embeddings=tied,
    )


ARCHITECTURES: dict[str, Callable[[dict[str, Any], str, bool], ModelConfig]] = {
    "gemma3": _gemma3,
    "llama": _llama,
}


def config_from_gguf(meta: dict[str, Any], source: str, tied: bool) -> ModelConfig:
    """Build the config from GGUF metadata; `tied` says whether the file has no output.weight."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedError(
            f"{source}: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    return ARCHITECTURES[arch](meta, source, tied)


# HF config.json -> the GGUF-style metadata keys the builders above read.
HF_MODEL_TYPES = {"gemma3_text": "gemma3", "gemma3": "gemma3", "llama": "llama"}


def config_from_hf(hf: dict[str, Any], source: str, tied: bool) -> ModelConfig:
    """Build the config from an HF config.json (for multimodal Gemma 3, its text_config)."""
    model_type = hf.get("model_type")
    if model_type == "gemma3" and "text_config" in hf:
        hf = {**hf["text_config"], "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    if model_type not in HF_MODEL_TYPES:
        raise UnsupportedError(
            f"{source}: model_type {model_type!r} is not supported (supported: {', '.join(HF_MODEL_TYPES)})"
        )
    arch = HF_MODEL_TYPES[model_type]
    p = arch + "."
    meta: dict[str, Any] = {
        "general.architecture": arch,
        p + "block_count": hf["num_hidden_layers"],
        p + "embedding_length": hf["hidden_size"],
        p + "feed_forward_length": hf["intermediate_size"],
        p + "attention.head_count": hf["num_attention_heads"],
        p + "attention.head_count_kv": hf.get("num_key_value_heads", hf["num_attention_heads"]),
        p + "vocab_size": hf["vocab_size"],
        p + "context_length": hf.get("max_position_embeddings", 4096),
        p + "attention.layer_norm_rms_epsilon": hf.get("rms_norm_eps", 1e-6),
        p + "rope.freq_base": hf.get("rope_theta", 10_000.0),
        "larql.rope_interleaved": False,  # HF checkpoints use the rotate-half layout
    }
    if "head_dim" in hf:
        meta[p + "attention.key_length"] = hf["head_dim"]
    if hf.get("sliding_window"):
        meta[p + "attention.sliding_window"] = hf["sliding_window"]
    if arch == "gemma3":
        meta[p + "rope.freq_base_swa"] = hf.get("rope_local_base_freq", 10_000.0)
        meta[p + "attention.sliding_window_pattern"] = hf.get("sliding_window_pattern", 6)
        if hf.get("query_pre_attn_scalar"):
            meta[p + "attention.scale"] = float(hf["query_pre_attn_scalar"]) ** -0.5
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if hf.get(key):
                meta[p + key] = hf[key]
    cfg = ARCHITECTURES[arch](meta, source, tied)
    layer_types = hf.get("layer_types")
    if arch == "gemma3" and layer_types:
        from dataclasses import replace

        if len(layer_types) != cfg.n_layers:
            raise ModelFormatError(f"{source}: layer_types lists {len(layer_types)} layers, the model has {cfg.n_layers}")
        cfg = replace(cfg, global_layers=tuple(t == "full_attention" for t in layer_types))
    return cfg
