"""GGUF metadata for a vindex whose source GGUF is gone (or that never had one): the architecture's
hyperparameters from index.json's `model_config` and the tokenizer from the vindex's tokenizer.json,
under the key names llama.cpp reads (the inverse of model/config.py and model/tokenizer.py).

The tokenizer comes back exactly for larql: a SentencePiece vocabulary (tokenizer.ggml.model
`llama`) was turned into BPE merges ranked by each merged piece's score (model/tokenizer.py), and
the scores written here are minus each piece's first merge rank, which ranks the merges in the same
order, so larql rebuilds the same merges. The original scores are not in the vindex: pieces of
equal score, which llama.cpp orders by position in the text, now have distinct scores. Byte-level
BPE (`gpt2`) keeps its merges as they are.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from larql.errors import VindexError

# llama.cpp token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


# larql's architecture -> llama.cpp's: it converts Mistral and Mixtral as llamas
GGUF_ARCH = {"mistral": "llama", "mixtral": "llama"}


def gguf_arch(cfg: dict[str, Any]) -> str:
    """general.architecture of a GGUF for this model_config."""
    return GGUF_ARCH.get(cfg["arch"], cfg["arch"])


def architecture_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The `{arch}.*` keys model/config.py reads, from a vindex's model_config."""
    arch = gguf_arch(cfg)
    if arch not in ("gemma3", "gemma2", "llama", "qwen2", "qwen3", "phi3", "gpt2"):
        raise VindexError(f"COMPILE ... FORMAT GGUF without the source GGUF writes gemma2, gemma3, gpt2, llama "
                          f"(mistral, mixtral), phi3, qwen2 and qwen3 metadata; this vindex is {arch}: keep its "
                          f"source GGUF, or write FORMAT SAFETENSORS")
    p = arch + "."
    out: dict[str, Any] = {
        p + "context_length": int(cfg["context_length"]), p + "embedding_length": int(cfg["hidden"]),
        p + "block_count": int(cfg["n_layers"]), p + "feed_forward_length": int(cfg["ffn"]),
        p + "attention.head_count": int(cfg["n_heads"]),
    }
    if arch == "gpt2":  # LayerNorm, learned positions, no rope; the query scale is llama.cpp's 1/sqrt(head_dim)
        if abs(float(cfg["attn_scale"]) - int(cfg["head_dim"]) ** -0.5) > 1e-9:
            raise VindexError("a GPT-2 GGUF cannot state a query scale other than 1/sqrt(head_dim)")
        return out | {p + "attention.layer_norm_epsilon": float(cfg["norm_eps"]), p + "vocab_size": int(cfg["vocab"])}
    out |= {
        p + "attention.head_count_kv": int(cfg["n_kv_heads"]),
        p + "attention.key_length": int(cfg["head_dim"]), p + "attention.value_length": int(cfg["head_dim"]),
        p + "attention.layer_norm_rms_epsilon": float(cfg["norm_eps"]), p + "rope.freq_base": float(cfg["rope_base"]),
    }
    if arch == "gemma2":
        return out | _gemma2_fields(cfg, p)
    if arch == "gemma3":
        out[p + "attention.sliding_window"] = int(cfg["sliding_window"])
        pattern = _global_pattern(cfg["global_layers"])
        if pattern != 6:  # llama.cpp's default for Gemma 3; written only when it differs
            out[p + "attention.sliding_window_pattern"] = pattern
        if float(cfg["rope_base_local"]) != 10_000.0:
            out[p + "rope.freq_base_swa"] = float(cfg["rope_base_local"])
        if abs(float(cfg["attn_scale"]) - int(cfg["head_dim"]) ** -0.5) > 1e-9:
            out[p + "attention.scale"] = float(cfg["attn_scale"])
        for key, name in (("final_softcap", "final_logit_softcapping"), ("attn_softcap", "attn_logit_softcapping")):
            if float(cfg[key]):
                out[p + name] = float(cfg[key])
    else:  # what llama.cpp's converter writes for these, and Gemma 3's does not
        out[p + "vocab_size"] = int(cfg["vocab"])
        out[p + "rope.dimension_count"] = int(cfg["head_dim"])
        if int(cfg["sliding_window"]):
            out[p + "attention.sliding_window"] = int(cfg["sliding_window"])
        if cfg.get("n_experts"):
            out[p + "expert_count"] = int(cfg["n_experts"])
            out[p + "expert_used_count"] = int(cfg["n_experts_used"])
        if cfg.get("rope_scaling") == "longrope":  # the factors themselves are tensors (compile.py writes them)
            out[p + "rope.scaling.original_context_length"] = int(cfg["rope_original_context"])
            out[p + "rope.scaling.attn_factor"] = float(cfg["rope_attn_factor"])
        elif cfg.get("rope_scaling"):
            out[p + "rope.scaling.type"] = str(cfg["rope_scaling"])
            out[p + "rope.scaling.factor"] = float(cfg["rope_factor"])
    return out


def _gemma2_fields(cfg: dict[str, Any], p: str) -> dict[str, Any]:
    """Gemma 2's keys: its GGUF states no query scale (llama.cpp derives it from the size, as
    model/config.py does), so a model scaled otherwise cannot be written; the soft-caps are always
    written (absent, llama.cpp and larql would take 50 and 30)."""
    hidden, heads, head_dim = int(cfg["hidden"]), int(cfg["n_heads"]), int(cfg["head_dim"])
    from larql.model.config import GEMMA2_27B_LAYERS

    derived = (hidden // heads if int(cfg["n_layers"]) == GEMMA2_27B_LAYERS else head_dim) ** -0.5
    if abs(float(cfg["attn_scale"]) - derived) > 1e-9:
        raise VindexError(f"this Gemma 2 scales queries by {float(cfg['attn_scale']):.6g}, which a GGUF cannot "
                          f"state (llama.cpp derives {derived:.6g}); keep its source GGUF, or write FORMAT SAFETENSORS")
    if float(cfg["rope_base_local"]) != float(cfg["rope_base"]):
        raise VindexError("a Gemma 2 GGUF has one rope base; this model's sliding layers use another")
    pattern = _global_pattern(cfg["global_layers"])
    return {p + "attention.sliding_window": int(cfg["sliding_window"]), p + "attention.sliding_window_pattern": pattern,
            p + "attn_logit_softcapping": float(cfg["attn_softcap"]),
            p + "final_logit_softcapping": float(cfg["final_softcap"])}


def _global_pattern(global_layers: list[bool]) -> int:
    """Gemma 3's sliding-window pattern: every n-th layer global (model/config.py's rule, inverted)."""
    n = next((i + 1 for i, g in enumerate(global_layers) if g), len(global_layers) + 1)
    if any(g != ((i + 1) % n == 0) for i, g in enumerate(global_layers)):
        raise VindexError("this vindex's global layers follow no every-n-th pattern, which GGUF cannot state")
    return n


def tokenizer_fields(tokenizer_json: str, bos_id: int | None, eos_ids: list[int], arch: str = "") -> dict[str, Any]:
    """The `tokenizer.ggml.*` keys model/tokenizer.py reads, from the vindex's tokenizer.json."""
    doc = json.loads(tokenizer_json)
    model = doc["model"]
    if model.get("type") != "BPE":
        raise VindexError(f"the vindex's tokenizer is {model.get('type')}, not BPE: GGUF metadata for it needs the "
                          f"source GGUF")
    vocab: dict[str, int] = model["vocab"]
    added = {int(t["id"]): t for t in doc.get("added_tokens", [])}
    n = max([*vocab.values(), *added]) + 1
    tokens = [""] * n
    for text, i in vocab.items():
        tokens[i] = text
    for i, t in added.items():
        tokens[i] = t["content"]
    types = np.full(n, NORMAL, dtype=np.int32)
    for i, t in added.items():
        types[i] = CONTROL if t.get("special") else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    out: dict[str, Any] = {}
    if model.get("byte_fallback"):  # a SentencePiece vocabulary: scores that rank the merges as they are
        out["tokenizer.ggml.model"] = "llama"
        scores = np.full(n, -float(len(merges) + 1), dtype=np.float32)
        for rank, m in reversed(list(enumerate(merges))):  # the lowest rank wins
            left, right = m.split(" ", 1)
            piece = vocab.get(left + right)
            if piece is not None:
                scores[piece] = -float(rank)
        for i, text in enumerate(tokens):
            if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                types[i] = BYTE
        unk = model.get("unk_token")
        if unk in vocab:
            if vocab[unk] not in added:  # Gemma's <unk> is a control token, and stays one
                types[vocab[unk]] = UNKNOWN
            out["tokenizer.ggml.unknown_token_id"] = vocab[unk]
        out["tokenizer.ggml.pre"] = "default"
        out["tokenizer.ggml.tokens"] = tokens
        out["tokenizer.ggml.scores"] = scores
        out["tokenizer.ggml.add_space_prefix"] = _prepends_space(doc.get("normalizer"))
    else:
        out["tokenizer.ggml.model"] = "gpt2"
        out["tokenizer.ggml.pre"] = _pre_name(doc.get("pre_tokenizer"), arch)
        out["tokenizer.ggml.tokens"] = tokens
        out["tokenizer.ggml.merges"] = merges
        out["tokenizer.ggml.add_space_prefix"] = False
    out["tokenizer.ggml.token_type"] = types
    if bos_id is not None:
        out["tokenizer.ggml.bos_token_id"] = int(bos_id)
    if eos_ids:
        out["tokenizer.ggml.eos_token_id"] = int(eos_ids[0])
    if "<pad>" in vocab:
        out["tokenizer.ggml.padding_token_id"] = vocab["<pad>"]
    out["tokenizer.ggml.add_bos_token"] = _adds_bos(doc.get("post_processor"))
    out["tokenizer.ggml.add_eos_token"] = False
    out["tokenizer.ggml.add_sep_token"] = False
    return out


def _prepends_space(normalizer: Any) -> bool:
    parts = normalizer.get("normalizers", [normalizer]) if isinstance(normalizer, dict) else []
    return any(isinstance(p, dict) and p.get("type") == "Prepend" for p in parts)


def _adds_bos(post: Any) -> bool:
    return isinstance(post, dict) and post.get("type") == "TemplateProcessing" and "SpecialToken" in str(post.get("single"))


def _pre_name(pre: Any, arch: str) -> str:
    """tokenizer.ggml.pre for the pre-tokenizer model/tokenizer.py builds for it."""
    kinds = [p.get("type") for p in pre.get("pretokenizers", [pre])] if isinstance(pre, dict) else []
    if kinds == ["ByteLevel"]:
        return "default"
    if kinds == ["Digits", "ByteLevel"]:
        return "smollm"
    if kinds == ["Split", "ByteLevel"]:  # one regex in model/tokenizer.py; llama.cpp names it per family
        return "qwen2" if arch.startswith("qwen") else "llama-bpe"
    raise VindexError(f"the vindex's pre-tokenizer ({' + '.join(map(str, kinds)) or 'none'}) has no GGUF name larql "
                      f"knows: keep its source GGUF, or write FORMAT SAFETENSORS")


def write_fields(writer: Any, fields: dict[str, Any]) -> None:
    """Add `fields` to a gguf.GGUFWriter with the value types llama.cpp expects."""
    import gguf

    T = gguf.GGUFValueType
    for key, value in fields.items():
        if isinstance(value, bool):
            writer.add_key_value(key, value, T.BOOL)
        elif isinstance(value, int):
            writer.add_key_value(key, value, T.UINT32)
        elif isinstance(value, float):
            writer.add_key_value(key, value, T.FLOAT32)
        elif isinstance(value, str):
            writer.add_key_value(key, value, T.STRING)
        elif isinstance(value, np.ndarray):
            sub = T.FLOAT32 if value.dtype == np.float32 else T.INT32
            writer.add_key_value(key, value.tolist(), T.ARRAY, sub)
        elif value:  # a list of strings: tokens, merges (GGUF has no empty array: none is no key)
            writer.add_key_value(key, list(value), T.ARRAY, T.STRING)


def vindex_fields(index: dict[str, Any], tokenizer_json: str) -> dict[str, Any]:
    """Every metadata key of a GGUF for this vindex, but general.architecture (the writer's)."""
    cfg = index["model_config"]
    tok = index.get("tokenizer", {})
    return {"general.name": str(index["model"]), "general.quantization_version": 2, **architecture_fields(cfg),
            **tokenizer_fields(tokenizer_json, tok.get("bos_id"), list(tok.get("eos_ids", [])), gguf_arch(cfg))}
