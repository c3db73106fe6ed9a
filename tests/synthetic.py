"""Small seeded models written by the tests, as GGUF and as HF safetensors directories, plus an
independent float64 reference forward pass over HF-convention weights to check larql against."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

# byte-level vocabulary: the 256 GPT-2 byte symbols, then one control token
_BYTES = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
_MISSING = [b for b in range(256) if b not in _BYTES]
BYTE_SYMBOLS = [chr(c) for c in _BYTES] + [chr(256 + i) for i in range(len(_MISSING))]
EOS = "<|endoftext|>"
VOCAB = BYTE_SYMBOLS + [EOS]


@dataclass(frozen=True)
class TinySpec:
    arch: str  # "llama" | "gemma3"
    n_layers: int = 2
    hidden: int = 64
    ffn: int = 128
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    rope_base: float = 10000.0
    eps: float = 1e-6
    sliding_window: int = 4  # gemma3 only: layer 0 local, layer 1 global (pattern 2)

    @property
    def vocab(self) -> int:
        return len(VOCAB)


def hf_weights(spec: TinySpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under HF names and conventions (Gemma norms are `w` in `(1 + w)`)."""
    rng = np.random.default_rng(seed)
    q_out, kv_out = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        base = 0.0 if spec.arch == "gemma3" else 1.0
        return (base + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": (rng.standard_normal((spec.vocab, spec.hidden)) * 0.5).astype(np.float32),
         "model.norm.weight": norm(spec.hidden)}
    for i in range(spec.n_layers):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": norm(spec.hidden),
              p + "self_attn.q_proj.weight": mat(q_out, spec.hidden),
              p + "self_attn.k_proj.weight": mat(kv_out, spec.hidden),
              p + "self_attn.v_proj.weight": mat(kv_out, spec.hidden),
              p + "self_attn.o_proj.weight": mat(spec.hidden, q_out),
              p + "mlp.gate_proj.weight": mat(spec.ffn, spec.hidden),
              p + "mlp.up_proj.weight": mat(spec.ffn, spec.hidden),
              p + "mlp.down_proj.weight": mat(spec.hidden, spec.ffn),
              p + "post_attention_layernorm.weight": norm(spec.hidden)}
        if spec.arch == "gemma3":
            w |= {p + "self_attn.q_norm.weight": norm(spec.head_dim),
                  p + "self_attn.k_norm.weight": norm(spec.head_dim),
                  p + "pre_feedforward_layernorm.weight": norm(spec.hidden),
                  p + "post_feedforward_layernorm.weight": norm(spec.hidden)}
    return w


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE({s: i for i, s in enumerate(BYTE_SYMBOLS)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS, special=True, normalized=False)])
    return tok


def write_hf_dir(directory: Path, spec: TinySpec, weights: dict[str, np.ndarray]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    model_type = "gemma3_text" if spec.arch == "gemma3" else "llama"
    config = {"model_type": model_type, "num_hidden_layers": spec.n_layers, "hidden_size": spec.hidden,
              "intermediate_size": spec.ffn, "num_attention_heads": spec.n_heads,
              "num_key_value_heads": spec.n_kv_heads, "head_dim": spec.head_dim, "vocab_size": spec.vocab,
              "max_position_embeddings": 64, "rms_norm_eps": spec.eps, "rope_theta": spec.rope_base,
              "tie_word_embeddings": True, "eos_token_id": spec.vocab - 1}
    if spec.arch == "gemma3":
        config |= {"rope_local_base_freq": spec.rope_base / 10, "sliding_window": spec.sliding_window,
                   "layer_types": [("sliding_attention", "full_attention")[i % 2] for i in range(spec.n_layers)],
                   "query_pre_attn_scalar": spec.head_dim}
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, str(directory / "model.safetensors"))
    build_tokenizer().save(str(directory / "tokenizer.json"))
    return directory


def _permute_for_gguf(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter reorders q/k rows so that rope pairs adjacent elements."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}


def write_gguf(path: Path, spec: TinySpec, weights: dict[str, np.ndarray],
               qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32) -> dict[str, np.ndarray]:
    """Write the model as llama.cpp would convert it. Matrices are stored as `qtype`.

    Returns the HF-convention float32 weights the file actually holds (after quantization), for
    the reference forward pass.
    """
    writer = gguf.GGUFWriter(str(path), spec.arch)
    a = spec.arch
    writer.add_uint32(f"{a}.block_count", spec.n_layers)
    writer.add_uint32(f"{a}.embedding_length", spec.hidden)
    writer.add_uint32(f"{a}.feed_forward_length", spec.ffn)
    writer.add_uint32(f"{a}.attention.head_count", spec.n_heads)
    writer.add_uint32(f"{a}.attention.head_count_kv", spec.n_kv_heads)
    writer.add_uint32(f"{a}.attention.key_length", spec.head_dim)
    writer.add_uint32(f"{a}.attention.value_length", spec.head_dim)
    writer.add_uint32(f"{a}.context_length", 64)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", spec.eps)
    writer.add_float32(f"{a}.rope.freq_base", spec.rope_base)
    if a == "gemma3":
        writer.add_uint32(f"{a}.attention.sliding_window", spec.sliding_window)
        writer.add_uint32(f"{a}.attention.sliding_window_pattern", 2)
        writer.add_float32(f"{a}.rope.freq_base_swa", spec.rope_base / 10)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(VOCAB)
    writer.add_token_types([1] * len(BYTE_SYMBOLS) + [3])
    writer.add_token_merges([])
    writer.add_eos_token_id(len(VOCAB) - 1)
    writer.add_add_bos_token(False)
    held: dict[str, np.ndarray] = {}
    for name, value in weights.items():
        stored = value
        if a == "llama" and name.endswith("q_proj.weight"):
            stored = _permute_for_gguf(value, spec.n_heads)
        elif a == "llama" and name.endswith("k_proj.weight"):
            stored = _permute_for_gguf(value, spec.n_kv_heads)
        if a == "gemma3" and "norm" in name:
            stored = value + np.float32(1.0)
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        else:
            layer, rest = name[len("model.layers."):].split(".", 1)
            part = rest.rsplit(".", 1)[0]
            if part == "post_attention_layernorm":
                part_g = "post_attention_norm" if a == "gemma3" else "ffn_norm"
            else:
                part_g = _GGUF_NAMES[part]
            gname = f"blk.{layer}.{part_g}.weight"
        if stored.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            raw = gguf.quants.quantize(stored, qtype)
            writer.add_tensor(gname, raw, raw_dtype=qtype)
            back = gguf.quants.dequantize(raw, qtype).reshape(stored.shape).astype(np.float32)
        else:
            writer.add_tensor(gname, np.ascontiguousarray(stored))
            back = stored
        # undo the storage conventions so the reference sees HF-convention weights
        if a == "llama" and name.endswith("q_proj.weight"):
            back = _unpermute(back, spec.n_heads)
        elif a == "llama" and name.endswith("k_proj.weight"):
            back = _unpermute(back, spec.n_kv_heads)
        if a == "gemma3" and "norm" in name:
            back = back - np.float32(1.0)
        held[name] = back
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# --- independent reference forward pass (float64, full sequence, HF conventions) -------------------


def reference_logits(spec: TinySpec, w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    gemma = spec.arch == "gemma3"
    f = {k: v.astype(np.float64) for k, v in w.items()}

    def norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + spec.eps)
        return y * ((1.0 + weight) if gemma else weight)

    def rope(x: np.ndarray, base: float) -> np.ndarray:  # x (T, H, d), rotate-half
        d = x.shape[-1]
        inv = 1.0 / base ** (np.arange(0, d, 2) / d)
        ang = np.arange(x.shape[0])[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    t = len(ids)
    x = f["model.embed_tokens.weight"][ids] * (math.sqrt(spec.hidden) if gemma else 1.0)
    for i in range(spec.n_layers):
        p = f"model.layers.{i}."
        is_global = (not gemma) or (i % 2 == 1)
        h = norm(x, f[p + "input_layernorm.weight"])
        q = (h @ f[p + "self_attn.q_proj.weight"].T).reshape(t, spec.n_heads, spec.head_dim)
        k = (h @ f[p + "self_attn.k_proj.weight"].T).reshape(t, spec.n_kv_heads, spec.head_dim)
        v = (h @ f[p + "self_attn.v_proj.weight"].T).reshape(t, spec.n_kv_heads, spec.head_dim)
        if gemma:
            q, k = norm(q, f[p + "self_attn.q_norm.weight"]), norm(k, f[p + "self_attn.k_norm.weight"])
        base = spec.rope_base if is_global else spec.rope_base / 10
        q, k = rope(q, base), rope(k, base)
        group = spec.n_heads // spec.n_kv_heads
        out = np.zeros((t, spec.n_heads, spec.head_dim))
        for hd in range(spec.n_heads):
            s = q[:, hd] @ k[:, hd // group].T / math.sqrt(spec.head_dim)
            qi, kj = np.arange(t)[:, None], np.arange(t)[None, :]
            ok = kj <= qi
            if gemma and not is_global:
                ok &= (qi - kj) < spec.sliding_window
            s = np.where(ok, s, -np.inf)
            pr = np.exp(s - s.max(axis=-1, keepdims=True))
            pr /= pr.sum(axis=-1, keepdims=True)
            out[:, hd] = pr @ v[:, hd // group]
        a = out.reshape(t, -1) @ f[p + "self_attn.o_proj.weight"].T
        if gemma:
            a = norm(a, f[p + "post_attention_layernorm.weight"])
            x = x + a
            h = norm(x, f[p + "pre_feedforward_layernorm.weight"])
        else:
            x = x + a
            h = norm(x, f[p + "post_attention_layernorm.weight"])
        g = h @ f[p + "mlp.gate_proj.weight"].T
        act = (0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))) if gemma else g / (1 + np.exp(-g))
        m = (act * (h @ f[p + "mlp.up_proj.weight"].T)) @ f[p + "mlp.down_proj.weight"].T
        if gemma:
            m = norm(m, f[p + "post_feedforward_layernorm.weight"])
        x = x + m
    return norm(x, f["model.norm.weight"]) @ f["model.embed_tokens.weight"].T


def tiny_vindex(root: Path, spec: TinySpec, seed: int, level: str = "inference", dtype: str = "f32") -> Path:
    """A seeded tiny model written as `root/m.gguf` (Q8_0) and extracted to `root/t.vindex`."""
    from larql.vindex.extract import extract

    write_gguf(root / "m.gguf", spec, hf_weights(spec, seed=seed), gguf.GGMLQuantizationType.Q8_0)
    return extract(root / "m.gguf", root / "t.vindex", level=level, dtype=dtype)
