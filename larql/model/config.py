"""ModelConfig: everything the forward pass needs to know, from GGUF metadata or an HF config.json.

One frozen dataclass covers every supported architecture; each architecture is a small function
filling it in: here for GGUF metadata, in `hf_config.py` for an HF config.json. The fields say what
differs between architectures (norm kind, positions, gated MLP, rope scaling, soft-caps ...); the
forward pass reads them and stays one file. Fields added after version 1 of the vindex format have
defaults, so a vindex written before them still describes its model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelFormatError, UnsupportedError
from larql.io.jsonfile import read_json

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
    norm: str = "rms"  # "rms" | "layer" (LayerNorm with a bias, GPT-2)
    positions: str = "rope"  # "rope" | "learned" (an absolute position embedding added to the tokens, GPT-2)
    gated_mlp: bool = True  # act(gate) * up; False: act(fc) with no up projection (GPT-2)
    # RoPE scaling of the global layers' frequencies, as transformers computes it: "" (none),
    # "linear" (every frequency / factor), "llama3" (low frequencies / factor, high ones kept, a
    # smooth blend between, set by the two wavelength factors and the original context) or
    # "longrope" (Phi-3: frequency i / short_factors[i], or / long_factors[i] in a pass that reaches
    # past the original context; cos and sin times rope_attn_factor either way)
    rope_scaling: str = ""
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_context: int = 0
    # mixture of experts (Mixtral): experts per layer, and how many each position uses; 0: dense FFN
    n_experts: int = 0
    n_experts_used: int = 0
    # llama.cpp's rope_freqs.weight (its form of Llama 3.1's scaling): one factor per frequency, each
    # global-layer frequency divided by its factor; () for none
    rope_freq_factors: tuple[float, ...] = ()
    rope_short_factors: tuple[float, ...] = ()  # longrope's, one per frequency
    rope_long_factors: tuple[float, ...] = ()
    rope_attn_factor: float = 1.0  # longrope's scale of cos and sin (so of q.k by its square)

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base if self.global_layers[layer] else self.rope_base_local

    def layer_window(self, layer: int) -> int:
        return 0 if self.global_layers[layer] else self.sliding_window

    def long_rope(self, seq_len: int) -> bool:
        """Whether a pass whose last position is seq_len - 1 rotates with longrope's long factors
        (transformers: max(position_ids) + 1 > original_max_position_embeddings)."""
        return self.rope_scaling == "longrope" and seq_len > self.rope_original_context

    def rope_inv_freq(self, base: float, long: bool = False) -> NDArray[np.float32]:
        """The `(head_dim/2,)` rotation frequencies for layers with this rope base, scaled as
        transformers scales them (only the global base is scaled; local layers keep theirs);
        `long`: longrope's long factors instead of its short ones."""
        d = self.head_dim
        exponent = np.arange(0, d, 2, dtype=np.float32) / np.float32(d)
        power = np.power(np.float32(base), exponent).astype(np.float32)  # (d/2,)
        if self.rope_scaling == "longrope" and base == self.rope_base:  # 1 / (factor_i * base^(2i/d))
            ext = np.asarray(self.rope_long_factors if long else self.rope_short_factors, dtype=np.float32)
            return (np.float32(1.0) / (ext * power)).astype(np.float32)
        inv = (np.float32(1.0) / power).astype(np.float32)  # (d/2,)
        if base != self.rope_base:
            return inv
        if self.rope_freq_factors:  # as ggml_rope_ext's freq_factors: theta_i / factor_i
            inv = (inv / np.asarray(self.rope_freq_factors, dtype=np.float32)).astype(np.float32)
        if not self.rope_scaling:
            return inv
        factor = np.float32(self.rope_factor)
        if self.rope_scaling == "linear":
            return (inv / factor).astype(np.float32)
        # llama3, step for step as transformers' _compute_llama3_parameters (float32 tensors)
        low, high, old = self.rope_low_freq_factor, self.rope_high_freq_factor, self.rope_original_context
        wavelen = np.float32(2 * math.pi) / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv).astype(np.float32)
        smooth = ((np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)).astype(np.float32)
        blended = (np.float32(1.0) - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(medium, blended, scaled).astype(np.float32)


def read_hf_config(path: Path) -> dict[str, Any]:
    """An HF config.json, read bounded (size before reading, nesting before parsing, NaN refused)."""
    hf = read_json(path, MAX_HF_CONFIG_BYTES, MAX_HF_CONFIG_DEPTH, "model config", ModelFormatError)
    if not isinstance(hf, dict) or not isinstance(hf.get("text_config", {}), dict):
        raise ModelFormatError(f"{path}: not a model config (config.json must be a JSON object)")
    return hf


def check_hf_values(hf: dict[str, Any], source: str) -> None:
    """Refuse config.json values of the wrong type or far out of range (a hostile or damaged file)
    before anything is sized by them: the layer count first (a per-layer table of 2^40 entries
    would never finish), then every integer and number the builders read."""
    text = hf.get("text_config")
    for cfg in (hf, text if isinstance(text, dict) else {}):
        for key in HF_INTS:
            v = cfg.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 1 << 40):
                raise ModelFormatError(f"{source}: config.json field {key!r} is {str(v)[:40]!r}; "
                                       f"expected a non-negative integer")
        layers = cfg.get("num_hidden_layers")
        if isinstance(layers, int) and not 1 <= layers <= LIMITS["n_layers"]:
            raise ModelFormatError(f"{source}: n_layers = {layers} is out of range (1..{LIMITS['n_layers']:,}): "
                                   f"a damaged model file?")
        for key in HF_NUMBERS:
            v = cfg.get(key)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)):
                raise ModelFormatError(f"{source}: config.json {key} must be a finite number, not {str(v)[:40]!r}")


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


# llama.cpp's Gemma 2 sizes by layer count; the 27B (46 layers) scales queries by its hidden size per head
GEMMA2_27B_LAYERS = 46


def _gemma2(meta: dict[str, Any], source: str, tied: bool) -> ModelConfig:
    """Gemma 2 as llama.cpp runs it. Its GGUF stores no query scale (HF's query_pre_attn_scalar):
    llama.cpp derives it from the model size, 1/sqrt(hidden // heads) for the 27B (46 layers) and
    1/sqrt(head_dim) otherwise, which is what the released models' configs say. Every 2nd layer is
    global; the soft-caps default to 50 and 30 when the metadata lacks them, as in llama.cpp."""
    p = "gemma2."
    n_layers = int(_need(meta, p + "block_count", source))
    hidden = int(_need(meta, p + "embedding_length", source))
    n_heads = int(_need(meta, p + "attention.head_count", source))
    head_dim = int(meta.get(p + "attention.key_length", hidden // n_heads))
    pattern = int(meta.get(p + "attention.sliding_window_pattern", 2))
    rope_base = float(meta.get(p + "rope.freq_base", 10_000.0))
    scale_dim = hidden // n_heads if n_layers == GEMMA2_27B_LAYERS else head_dim
    return ModelConfig(
        arch="gemma2", n_layers=n_layers, hidden=hidden,
        ffn=int(_need(meta, p + "feed_forward_length", source)),
        n_heads=n_heads, n_kv_heads=int(meta.get(p + "attention.head_count_kv", n_heads)),
        head_dim=head_dim, vocab=int(meta.get(p + "vocab_size", 0)),
        context_length=int(meta.get(p + "context_length", 8192)),
        norm_eps=float(_need(meta, p + "attention.layer_norm_rms_epsilon", source)),
        rope_base=rope_base, rope_base_local=float(meta.get(p + "rope.freq_base_swa", rope_base)),
        rope_interleaved=False,
        sliding_window=int(meta.get(p + "attention.sliding_window", 4096)),
        # llama.cpp's set_swa_pattern(n): layer i slides unless i % n == n - 1
        global_layers=tuple(pattern > 0 and i % pattern == pattern - 1 for i in range(n_layers)),
        embed_scale=math.sqrt(hidden), attn_scale=scale_dim ** -0.5,
        qk_norm=False, sandwich_norms=True, activation="gelu_tanh",
        final_softcap=float(meta.get(p + "final_logit_softcapping", 30.0)),
        attn_softcap=float(meta.get(p + "attn_logit_softcapping", 50.0)),
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
    scaling = str(meta.get(p + "rope.scaling.type", "none"))
    if scaling not in ("none", "linear"):
        raise UnsupportedError(f"{source}: metadata {p}rope.scaling.type is {scaling!r}; larql runs none or linear")
    # Mixtral is a llama in GGUF, with its experts counted in the metadata
    n_experts, used = int(meta.get(p + "expert_count", 0)), int(meta.get(p + "expert_used_count", 0))
    if n_experts and not 0 < used <= n_experts:
        raise ModelFormatError(f"{source}: metadata {p}expert_used_count is {used}; it must be 1..{p}expert_count "
                               f"({n_experts})")
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
        rope_scaling="" if scaling == "none" else scaling,
        rope_factor=float(meta.get(p + "rope.scaling.factor", 1.0)),
        n_experts=n_experts, n_experts_used=used if n_experts else 0,
    )


def _qwen3(meta: dict[str, Any], source: str, tied: bool) -> ModelConfig:
    """Qwen3 as llama.cpp converts it: Qwen2's layout (rotate-half RoPE, q/k rows not permuted)
    plus per-head q/k norms."""
    return replace(_llama(meta, source, tied), qk_norm=True)


def _phi3(meta: dict[str, Any], source: str, tied: bool) -> ModelConfig:
    """Phi-3 as llama.cpp converts it: Llama's layout with fused q/k/v and gate/up (gguf_fused.py)."""
    cfg = _llama(meta, source, tied)
    rot = int(meta.get("phi3.rope.dimension_count", cfg.head_dim))
    if rot != cfg.head_dim:
        raise UnsupportedError(f"{source}: metadata phi3.rope.dimension_count is {rot}; larql runs rotary "
                               f"embeddings over the whole head ({cfg.head_dim})")
    return cfg


def _gpt2(meta: dict[str, Any], source: str, tied: bool) -> ModelConfig:
    """GPT-2 as llama.cpp converts it: LayerNorm with biases, learned positions, GELU MLP, fused q/k/v."""
    p = "gpt2."
    hidden = int(_need(meta, p + "embedding_length", source))
    n_heads = int(_need(meta, p + "attention.head_count", source))
    n_layers = int(_need(meta, p + "block_count", source))
    return ModelConfig(
        arch="gpt2", n_layers=n_layers, hidden=hidden, ffn=int(_need(meta, p + "feed_forward_length", source)),
        n_heads=n_heads, n_kv_heads=n_heads, head_dim=hidden // n_heads, vocab=int(meta.get(p + "vocab_size", 0)),
        context_length=int(_need(meta, p + "context_length", source)),
        norm_eps=float(meta.get(p + "attention.layer_norm_epsilon", 1e-5)),
        rope_base=10_000.0, rope_base_local=10_000.0, rope_interleaved=False,  # unused: no RoPE
        sliding_window=0, global_layers=(True,) * n_layers, embed_scale=1.0, attn_scale=(hidden // n_heads) ** -0.5,
        qk_norm=False, sandwich_norms=False, activation="gelu_tanh", final_softcap=0.0, attn_softcap=0.0,
        tied_embeddings=tied, norm="layer", positions="learned", gated_mlp=False,
    )


ARCHITECTURES: dict[str, Callable[[dict[str, Any], str, bool], ModelConfig]] = {
    "gemma3": _gemma3,
    "gemma2": _gemma2,
    "llama": _llama,
    "qwen2": _llama,  # q/k/v biases are tensors; rope_interleaved is false for every arch but llama
    "qwen3": _qwen3,
    "phi3": _phi3,
    "gpt2": _gpt2,
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
