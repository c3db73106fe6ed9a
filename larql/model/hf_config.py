"""ModelConfig from an HF config.json: one function per model_type, every field that changes the
arithmetic either read or refused.

A field larql does not understand must never be ignored silently (a tiny Llama 3 with `rope_type:
llama3` read without its scaling loads and answers 1e-2 off). So each builder reads what it needs through `Fields`,
which names the file and the field in every error; fields that change the forward pass and are
not implemented (yarn / dynamic rope scaling, partial rotary, GPT-2's inverse-layer scaling...)
are refused with what is supported. Both config generations are read: transformers 4
(`rope_theta` + `rope_scaling`) and 5 (`rope_parameters`, per layer type for Gemma 3).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from larql.errors import ModelFormatError, UnsupportedError
from larql.model.config import ModelConfig

ROPE_TYPES = ("default", "linear", "llama3", "longrope")
ROPE_ALIASES = {"su": "longrope"}  # Phi-3's first configs named longrope "su"
# hidden_act / hidden_activation / activation_function -> the forward pass's activation
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
               "gelu_fast": "gelu_tanh"}


class Fields:
    """An HF config dict read field by field; errors name `<dir>/config.json` and the field."""

    def __init__(self, hf: dict[str, Any], source: str, model_type: str) -> None:
        self.hf, self.file, self.model_type = hf, f"{source}/config.json", model_type

    def need(self, key: str) -> Any:
        value = self.hf.get(key)
        if value is None:
            raise ModelFormatError(f"{self.file}: missing field {key!r}, which a {self.model_type} config must have")
        return value

    def int(self, key: str, default: int | None = None) -> int:
        value = self.hf.get(key, default) if default is not None else self.need(key)
        if value is None:
            value = default
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ModelFormatError(f"{self.file}: field {key!r} is {value!r}; expected a non-negative integer")
        return value

    def float(self, key: str, default: float) -> float:
        value = self.hf.get(key, default)
        if value is None:
            value = default
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ModelFormatError(f"{self.file}: field {key!r} is {value!r}; expected a number")
        return float(value)

    def refuse(self, key: str, value: Any, supported: str) -> UnsupportedError:
        return UnsupportedError(f"{self.file}: {key} = {value!r} is not supported; larql runs {supported}")

    def expect(self, key: str, allowed: tuple[Any, ...], default: Any, supported: str) -> Any:
        """The field's value, which must be one of `allowed` (absent: `default`)."""
        value = self.hf.get(key, default)
        if value not in allowed:
            raise self.refuse(key, value, supported)
        return value

    def activation(self, key: str, default: str) -> str:
        value = self.hf.get(key, default)
        if value not in ACTIVATIONS:
            raise self.refuse(key, value, ", ".join(ACTIVATIONS))
        return ACTIVATIONS[value]


def _rope(f: Fields, layer_type: str | None = None, default_theta: float = 10_000.0) -> dict[str, Any]:
    """rope_base and the scaling fields of ModelConfig, from rope_parameters (transformers 5) or
    rope_theta + rope_scaling (transformers 4); `layer_type` picks Gemma 3's per-type entry."""
    params = f.hf.get("rope_parameters")
    if isinstance(params, dict) and layer_type is not None and layer_type in params:
        params = params[layer_type]
    if not isinstance(params, dict):
        params = dict(f.hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", f.hf.get("rope_theta", default_theta))
    field = "rope_parameters" if "rope_parameters" in f.hf else "rope_scaling"
    kind = params.get("rope_type", params.get("type", "default"))
    kind = ROPE_ALIASES.get(kind, kind) if isinstance(kind, str) else kind
    if kind not in ROPE_TYPES:
        raise f.refuse(f"{field}.rope_type", kind, ", ".join(ROPE_TYPES))
    partial = params.get("partial_rotary_factor", f.hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise f.refuse("partial_rotary_factor", partial, "rotary embeddings over the whole head (1.0)")
    theta = params.get("rope_theta", default_theta)
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise ModelFormatError(f"{f.file}: {field}.rope_theta is {theta!r}; expected a positive number")
    out: dict[str, Any] = {"rope_base": float(theta)}
    if kind == "default":
        return out

    def param(key: str, fallback: Any = None) -> float:
        value = params.get(key, fallback)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ModelFormatError(f"{f.file}: {field}.{key} is {value!r}; rope_type {kind} needs a number")
        return float(value)

    if kind == "longrope":
        return out | _longrope(f, field, params, param)
    out |= {"rope_scaling": kind, "rope_factor": param("factor")}
    if kind == "llama3":
        low, high = param("low_freq_factor"), param("high_freq_factor")
        if high <= low:
            raise ModelFormatError(f"{f.file}: {field}.high_freq_factor must exceed low_freq_factor")
        out |= {"rope_low_freq_factor": low, "rope_high_freq_factor": high,
                "rope_original_context": int(param("original_max_position_embeddings",
                                                   f.hf.get("max_position_embeddings")))}
    return out


def _longrope(f: Fields, field: str, params: dict[str, Any], param: Callable[..., float]) -> dict[str, Any]:
    """Phi-3's longrope, as transformers' _compute_longrope_parameters: the factor defaults to
    max_position_embeddings / original_max_position_embeddings, the attention factor (cos and sin
    scale) to sqrt(1 + ln(factor) / ln(original)) when the factor exceeds 1."""
    half = f.int("head_dim", 0) or f.int("hidden_size") // f.int("num_attention_heads")
    half //= 2
    factors: dict[str, tuple[float, ...]] = {}
    for key in ("short_factor", "long_factor"):
        value = params.get(key)
        if (not isinstance(value, list) or len(value) != half
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)):
            raise ModelFormatError(f"{f.file}: {field}.{key} must list {half} positive numbers (one per rope "
                                   f"frequency), not {str(value)[:60]}")
        factors[key] = tuple(float(v) for v in value)
    original = int(param("original_max_position_embeddings", f.hf.get("original_max_position_embeddings")))
    if original <= 0:
        raise ModelFormatError(f"{f.file}: original_max_position_embeddings must be positive, not {original}")
    factor = params.get("factor")
    factor = f.int("max_position_embeddings") / original if factor is None else param("factor")
    attn = params.get("attention_factor")
    if attn is None:
        attn = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0
    else:
        attn = param("attention_factor")
    return {"rope_scaling": "longrope", "rope_factor": float(factor), "rope_original_context": original,
            "rope_short_factors": factors["short_factor"], "rope_long_factors": factors["long_factor"],
            "rope_attn_factor": float(attn)}


def _global_layers(f: Fields, n_layers: int, default: Callable[[int], bool]) -> tuple[bool, ...]:
    """Per layer: full attention (True) or sliding window, from layer_types or the family's rule."""
    types = f.hf.get("layer_types")
    if types is None:
        return tuple(default(i) for i in range(n_layers))
    if not isinstance(types, list) or len(types) != n_layers:
        raise ModelFormatError(f"{f.file}: layer_types must list one type per layer ({n_layers})")
    for t in types:
        if t not in ("full_attention", "sliding_attention"):
            raise f.refuse("layer_types", t, "full_attention and sliding_attention")
    return tuple(t == "full_attention" for t in types)


def _base(f: Fields, arch: str, **fields: Any) -> ModelConfig:
    """The fields every decoder-only config names the same way; `fields` overrides or adds."""
    hidden, n_heads = f.int("hidden_size"), f.int("num_attention_heads")
    head_dim = f.hf.get("head_dim") or hidden // n_heads
    n_layers = f.int("num_hidden_layers")
    if f.hf.get("mlp_bias"):
        raise f.refuse("mlp_bias", True, "MLPs without biases in this family")
    eps = fields.pop("eps_default", 1e-6)  # transformers' default for the family, if the field is absent
    values: dict[str, Any] = {
        "arch": arch, "n_layers": n_layers, "hidden": hidden, "ffn": f.int("intermediate_size"), "n_heads": n_heads,
        "n_kv_heads": f.int("num_key_value_heads", n_heads), "head_dim": int(head_dim), "vocab": f.int("vocab_size"),
        "context_length": f.int("max_position_embeddings", 4096), "norm_eps": f.float("rms_norm_eps", eps),
        "rope_interleaved": False,  # HF checkpoints use the rotate-half layout
        "sliding_window": 0, "global_layers": (True,) * n_layers, "embed_scale": 1.0,
        "attn_scale": int(head_dim) ** -0.5, "qk_norm": False, "sandwich_norms": False,
        "activation": fields.get("activation") or f.activation("hidden_act", "silu"),
        "final_softcap": 0.0, "attn_softcap": 0.0, "tied_embeddings": False,
    }
    values |= _rope(f)
    values |= fields
    values.setdefault("rope_base_local", values["rope_base"])
    return ModelConfig(**values)


def _windowed(f: Fields, arch: str, **fields: Any) -> ModelConfig:
    """Llama-like families whose sliding window (if any) covers every layer: Mistral, Phi-3."""
    window = f.int("sliding_window", 0) if f.hf.get("sliding_window") else 0
    n = f.int("num_hidden_layers")
    return _base(f, arch, sliding_window=window, global_layers=(window == 0,) * n, **fields)


def _mixtral(f: Fields) -> ModelConfig:
    """Mixtral: Mistral's attention, and per layer a router choosing each position's top-k experts."""
    n_experts, used = f.int("num_local_experts"), f.int("num_experts_per_tok")
    if not 0 < used <= n_experts:
        raise ModelFormatError(f"{f.file}: num_experts_per_tok = {used} must be between 1 and num_local_experts "
                               f"({n_experts})")
    return _windowed(f, "mixtral", n_experts=n_experts, n_experts_used=used, eps_default=1e-5)


def _qwen(f: Fields, arch: str, **fields: Any) -> ModelConfig:
    """Qwen2/Qwen3: a sliding window only with use_sliding_window, from layer max_window_layers on."""
    n, use = f.int("num_hidden_layers"), bool(f.hf.get("use_sliding_window", False))
    first = f.int("max_window_layers", n) if use else n
    global_layers = _global_layers(f, n, lambda i: not use or i < first)
    window = f.int("sliding_window", 0) if not all(global_layers) else 0
    if not all(global_layers) and window == 0:
        raise ModelFormatError(f"{f.file}: layer_types has sliding layers but sliding_window is not set")
    return _base(f, arch, sliding_window=window, global_layers=global_layers, **fields)


def _gemma(f: Fields, arch: str, every: int) -> ModelConfig:
    """Gemma 2 (every=2) and Gemma 3 (every=6 by default): sqrt(hidden) embeddings, sandwich norms,
    GELU-tanh, query_pre_attn_scalar, sliding layers between the global ones, soft-caps."""
    n, hidden = f.int("num_hidden_layers"), f.int("hidden_size")
    f.expect("use_bidirectional_attention", (False, None), False, "causal attention")  # EmbeddingGemma's is not
    every = f.int("sliding_window_pattern", every)
    global_layers = _global_layers(f, n, lambda i: (i + 1) % every == 0)
    head_dim = f.int("head_dim", 256)
    rope_full = _rope(f, "full_attention", 1_000_000.0 if arch == "gemma3" else 10_000.0)
    params = f.hf.get("rope_parameters")
    rope_local: dict[str, Any] = {}
    if arch == "gemma3":  # its local layers have their own base: per layer type (5) or rope_local_base_freq (4)
        per_type = isinstance(params, dict) and "sliding_attention" in params
        rope_local = (_rope(f, "sliding_attention") if per_type
                      else {"rope_base": f.float("rope_local_base_freq", 10_000.0)})
    if "rope_scaling" in rope_local:
        raise f.refuse("rope_parameters.sliding_attention.rope_type", rope_local["rope_scaling"],
                       "scaling on the full-attention layers only")
    fields: dict[str, Any] = dict(
        head_dim=head_dim, sliding_window=f.int("sliding_window", 4096), global_layers=global_layers,
        embed_scale=math.sqrt(hidden), attn_scale=f.float("query_pre_attn_scalar", head_dim) ** -0.5,
        qk_norm=arch == "gemma3", sandwich_norms=True,
        activation=f.activation("hidden_activation", "gelu_pytorch_tanh"),
        final_softcap=f.float("final_logit_softcapping", 0.0), attn_softcap=f.float("attn_logit_softcapping", 0.0),
        **rope_full,
    )
    if rope_local:
        fields["rope_base_local"] = rope_local["rope_base"]
    return _base(f, arch, **fields)


def _gpt2(f: Fields) -> ModelConfig:
    """GPT-2: LayerNorm with biases, learned positions, Conv1D projections, GELU MLP without a gate."""
    hidden, n_heads, n_layers = f.int("n_embd"), f.int("n_head"), f.int("n_layer")
    if f.hf.get("scale_attn_by_inverse_layer_idx"):
        raise f.refuse("scale_attn_by_inverse_layer_idx", True, "GPT-2 attention scaled by 1/sqrt(head_dim) only")
    head_dim = hidden // n_heads
    return ModelConfig(
        arch="gpt2", n_layers=n_layers, hidden=hidden, ffn=f.int("n_inner", 4 * hidden) or 4 * hidden,
        n_heads=n_heads, n_kv_heads=n_heads, head_dim=head_dim, vocab=f.int("vocab_size"),
        context_length=f.int("n_positions", 1024), norm_eps=f.float("layer_norm_epsilon", 1e-5),
        rope_base=10_000.0, rope_base_local=10_000.0, rope_interleaved=False,  # unused: no RoPE
        sliding_window=0, global_layers=(True,) * n_layers, embed_scale=1.0,
        attn_scale=head_dim ** -0.5 if f.hf.get("scale_attn_weights", True) else 1.0,
        qk_norm=False, sandwich_norms=False, activation=f.activation("activation_function", "gelu_new"),
        final_softcap=0.0, attn_softcap=0.0, tied_embeddings=False,
        norm="layer", positions="learned", gated_mlp=False,
    )


# model_type -> builder; `tied_embeddings` is set by the caller from tie_word_embeddings
HF_MODEL_TYPES: dict[str, Callable[[Fields], ModelConfig]] = {
    "llama": lambda f: _base(f, "llama"),
    "mistral": lambda f: _windowed(f, "mistral"),
    "phi3": lambda f: _windowed(f, "phi3", eps_default=1e-5),
    "qwen2": lambda f: _qwen(f, "qwen2"),
    "qwen3": lambda f: _qwen(f, "qwen3", qk_norm=True),
    "gemma2": lambda f: _gemma(f, "gemma2", 2),
    "gemma3_text": lambda f: _gemma(f, "gemma3", 6),
    "gpt2": _gpt2,
    "mixtral": _mixtral,
}


def config_from_hf(hf: dict[str, Any], source: str, tied: bool) -> ModelConfig:
    """Build the config from an HF config.json (for multimodal Gemma 3, its text_config)."""
    model_type = hf.get("model_type")
    if model_type == "gemma3" and "text_config" in hf:
        hf = {**hf["text_config"], "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    if model_type == "gemma3":
        model_type = "gemma3_text"
    if not isinstance(model_type, str) or model_type not in HF_MODEL_TYPES:
        raise UnsupportedError(f"{source}/config.json: model_type {str(model_type)[:80]!r} is not supported "
                               f"(supported: {', '.join(HF_MODEL_TYPES)})")
    from dataclasses import replace

    return replace(HF_MODEL_TYPES[model_type](Fields(hf, source, model_type)), tied_embeddings=tied)
