"""ModelConfig: everything the forward pass needs to know, from GGUF metadata or an HF config.json.

One frozen dataclass covers every supported architecture; each architecture is a small function
filling it in. Adding Qwen2 or Mistral means one more entry in ARCHITECTURES (and, for HF
directories, in HF_MODEL_TYPES): the forward pass already handles q/k/v biases, GQA, sliding
windows and both rope layouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from larql.errors import ModelFormatError, UnsupportedError
from larql.jsonfile import read_json

MAX_HF_CONFIG_BYTES = 4 << 20  # a config.json is a few KB; a multimodal one with its processor ~50 KB
MAX_HF_CONFIG_DEPTH = 16
# the bounds every config, from GGUF metadata or config.json, must be inside (checked before any
# allocation sized by them): far above any model larql runs, far below an overflow
LIMITS = {"n_layers": 4096, "hidden": 1 << 20, "ffn": 1 << 22, "n_heads": 4096, "n_kv_heads": 4096,
          "head_dim": 1 << 16, "vocab": 1 << 24, "context_length": 1 << 24, "sliding_window": 1 << 24}
# config.json keys read as integers / as numbers (finite, checked by type before any conversion)
HF_INTS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
           "vocab_size", "max_position_embeddings", "head_dim", "sliding_window", "sliding_window_pattern")
HF_NUMBERS = ("rms_norm_eps", "rope_theta", "rope_local_base_freq", "query_pre_attn_scalar",
              "final_logit_softcapping", "attn_logit_softcapping")


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


def read_hf_config(path: Path) -> dict[str, Any]:
    """An HF config.json, read bounded (size before reading, nesting before parsing, NaN refused)."""
    hf = read_json(path, MAX_HF_CONFIG_BYTES, MAX_HF_CONFIG_DEPTH, "model config", ModelFormatError)
    if not isinstance(hf, dict) or not isinstance(hf.get("text_config", {}), dict):
        raise ModelFormatError(f"{path}: not a model config (config.json must be a JSON object)")
    return hf


def check_config(cfg: ModelConfig, source: str) -> ModelConfig:
    """Refuse a config with sizes out of LIMITS or non-finite / non-positive scales (a hostile or
    damaged file), before anything is allocated from it."""
    for name, limit in LIMITS.items():
        value = getattr(cfg, name)
        low = 0 if name in ("vocab", "sliding_window") else 1
        if not low <= value <= limit:
            raise ModelFormatError(f"{source}: {name} = {value} is out of range ({low}..{limit:,}): a damaged model file?")
    if cfg.n_kv_heads > cfg.n_heads or cfg.n_heads % cfg.n_kv_heads:
        raise ModelFormatError(f"{source}: {cfg.n_heads} attention heads cannot share {cfg.n_kv_heads} key/value heads")
    for name in ("norm_eps", "rope_base", "rope_base_local", "embed_scale", "attn_scale"):
        value = getattr(cfg, name)
        if not (math.isfinite(value) and value > 0):
            raise ModelFormatError(f"{source}: {name} = {value} must be a finite number above 0")
    for name in ("final_softcap", "attn_softcap"):
        value = getattr(cfg, name)
        if not (math.isfinite(value) and value >= 0):
            raise ModelFormatError(f"{source}: {name} = {value} must be a finite number, 0 or more")
    return cfg


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
            f"{source}: architecture {str(arch)[:80]!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    return _build(arch, meta, source, tied)


def _build(arch: str, meta: dict[str, Any], source: str, tied: bool) -> ModelConfig:
    """The architecture's config from metadata, checked: the layer count before anything is sized
    by it (a per-layer table of 2^40 entries would never finish), every other value after."""
    layers = meta.get(arch + ".block_count")
    if isinstance(layers, (int, float)) and not isinstance(layers, bool) and not 1 <= layers <= LIMITS["n_layers"]:
        raise ModelFormatError(f"{source}: n_layers = {layers} is out of range (1..{LIMITS['n_layers']:,}): "
                               f"a damaged model file?")
    try:
        cfg = ARCHITECTURES[arch](meta, source, tied)
    except (TypeError, ValueError, OverflowError) as e:  # a value of the wrong type: int("x"), int(inf)
        raise ModelFormatError(f"{source}: a metadata value of the wrong type or out of range ({e})") from None
    return check_config(cfg, source)


# HF config.json -> the GGUF-style metadata keys the builders above read.
HF_MODEL_TYPES = {"gemma3_text": "gemma3", "gemma3": "gemma3", "llama": "llama"}


def config_from_hf(hf: dict[str, Any], source: str, tied: bool) -> ModelConfig:
    """Build the config from an HF config.json (for multimodal Gemma 3, its text_config)."""
    model_type = hf.get("model_type")
    if model_type == "gemma3" and "text_config" in hf:
        hf = {**hf["text_config"], "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    if not isinstance(model_type, str) or model_type not in HF_MODEL_TYPES:
        raise UnsupportedError(
            f"{source}: model_type {str(model_type)[:80]!r} is not supported (supported: {', '.join(HF_MODEL_TYPES)})"
        )
    arch = HF_MODEL_TYPES[model_type]
    p = arch + "."
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
        if key not in hf:
            raise ModelFormatError(f"{source}: config.json has no {key}")
    for key in HF_INTS:
        v = hf.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 1 << 40):
            raise ModelFormatError(f"{source}: config.json {key} must be a non-negative integer, not {str(v)[:40]!r}")
    for key in HF_NUMBERS:
        v = hf.get(key)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)):
            raise ModelFormatError(f"{source}: config.json {key} must be a finite number, not {str(v)[:40]!r}")
    layer_types = hf.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types)):
        raise ModelFormatError(f"{source}: config.json layer_types must be a list of strings")
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
    cfg = _build(arch, meta, source, tied)
    if arch == "gemma3" and layer_types:
        from dataclasses import replace

        if len(layer_types) != cfg.n_layers:
            raise ModelFormatError(f"{source}: layer_types lists {len(layer_types)} layers, the model has {cfg.n_layers}")
        cfg = replace(cfg, global_layers=tuple(t == "full_attention" for t in layer_types))
    return cfg
