"""Build the tiny random-weight reference models of tests/golden/architectures (a dev tool).

For each architecture: a seeded random model built by HF transformers itself (float32, eager
attention, 3 layers, hidden 32, the 257-token byte-level tokenizer of tests/synthetic.py), saved
as an HF directory (config.json + model.safetensors + tokenizer.json) by `save_pretrained`, with
what transformers computes for two prompts: token ids, logits at every position, the residual
entering layer 0 and after every layer, and layer 0's q projection before RoPE (and, for the
references in GENERATIONS, a greedy generation with its per-step logits; for Mixtral, each expert's
output, the chosen experts and their weights per layer). The parity tests
(tests/parity/test_architectures.py) compare larql against these files and need no torch.

Needs torch and transformers; neither is a runtime or CI dependency of larql. Run from the
repository root:
    python tools/make_tiny_references.py            # every architecture
    python tools/make_tiny_references.py gemma2     # one
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.synthetic import VOCAB, build_tokenizer  # noqa: E402 - after the path is set

OUT = ROOT / "tests" / "golden" / "architectures"
PROMPTS = ["The capital of France is Paris; the capital of Japan is Tokyo.", "Bees make honey"]
EOS = len(VOCAB) - 1

_COMMON: dict[str, Any] = {
    "vocab_size": len(VOCAB), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "bos_token_id": None, "eos_token_id": EOS, "pad_token_id": None,
}
_LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
# Phi-3's long-context scaling: per-frequency short / long factors (the long ones once a pass reaches
# past original_max_position_embeddings: prompt 0 does, prompt 1 does not), cos and sin scaled by
# sqrt(1 + ln(128 / 32) / ln 32) derived from the context ratio
_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.3, 2.1, 3.7],
             "long_factor": [1.1, 2.9, 7.5, 19.0]}
_GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}

# name -> (model_type, config fields over _COMMON, what the architecture exercises)
ARCHITECTURES: dict[str, tuple[str, dict[str, Any], str]] = {
    "llama3": ("llama", {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                         "tie_word_embeddings": False, "rope_parameters": _LLAMA3_ROPE},
               "rope scaling llama3 (original context 64 so that all three frequency bands occur), untied lm_head"),
    "qwen2": ("qwen2", {}, "q/k/v biases"),
    "qwen3": ("qwen3", {"head_dim": 16}, "q/k RMSNorm per head, explicit head_dim (16 x 4 heads != hidden 32)"),
    "mistral": ("mistral", {"sliding_window": 4}, "sliding window of 4 on every layer"),
    "gemma2": ("gemma2", {"sliding_window": 4, "query_pre_attn_scalar": 12, "attn_logit_softcapping": 5.0,
                          "final_logit_softcapping": 10.0, "hidden_activation": "gelu_pytorch_tanh"},
               "attention and final soft-caps, alternating sliding window, query_pre_attn_scalar, sandwich norms"),
    # a GGUF stores no query scale: llama.cpp derives 1/sqrt(head_dim) (1/sqrt(hidden / heads) for the
    # 27B), as the released models' query_pre_attn_scalar says; this one follows that rule
    "gemma2_gguf": ("gemma2", {"sliding_window": 4, "query_pre_attn_scalar": 8, "attn_logit_softcapping": 5.0,
                               "final_logit_softcapping": 10.0, "hidden_activation": "gelu_pytorch_tanh"},
                    "Gemma 2 with query_pre_attn_scalar = head_dim, as the released 2B and 9B: the GGUF reference"),
    "gemma3": ("gemma3_text", {"sliding_window": 4, "query_pre_attn_scalar": 8, "rope_parameters": _GEMMA3_ROPE,
                               "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
               "q/k norms, sandwich norms, linear rope scaling on the global layer"),
    "phi3": ("phi3", {"sliding_window": 6}, "fused qkv_proj and gate_up_proj, sliding window of 6"),
    "phi3_longrope": ("phi3", {"rope_parameters": _LONGROPE, "original_max_position_embeddings": 32},
                      "longrope scaling: short factors below 32 positions, long ones past them, attention factor"),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
                "a router choosing 2 of 4 experts per position, weights renormalised"),
    "gpt2": ("gpt2", {"n_embd": 32, "n_layer": 3, "n_head": 4, "n_inner": 64, "n_positions": 128,
                      "vocab_size": len(VOCAB), "bos_token_id": EOS, "eos_token_id": EOS, "layer_norm_epsilon": 1e-5},
             "LayerNorm with bias, learned positions, Conv1D fused qkv, GELU MLP without a gate"),
}


def _config(model_type: str, fields: dict[str, Any]) -> transformers.PretrainedConfig:
    base = {} if model_type == "gpt2" else dict(_COMMON)
    return transformers.AutoConfig.for_model(model_type, **(base | fields), attn_implementation="eager",
                                             dtype="float32")


def _randomize(model: torch.nn.Module, model_type: str, seed: int) -> None:
    """Weights large enough that every part of the layer shows in the output (transformers'
    0.02-std initialisation would leave the logits almost uniform)."""
    g = torch.Generator().manual_seed(seed)
    gemma = model_type.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.ndim == 2 and ("embed" in name or "wte" in name or "wpe" in name):
                p.copy_(0.5 * r)
            elif p.ndim >= 2:  # Mixtral's experts are (E, out, in)
                fan_in = p.shape[0] if model_type == "gpt2" else p.shape[-1]  # Conv1D stores (in, out)
                p.copy_(r / fan_in ** 0.5)
            elif name.endswith("bias"):
                p.copy_(0.1 * r)
            else:  # norm weights: Gemma's are w in (1 + w)
                p.copy_((0.0 if gemma else 1.0) + 0.1 * r)


def _layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    inner = model.transformer if hasattr(model, "transformer") else model.model
    return inner.h if hasattr(inner, "h") else inner.layers


def _run(model: torch.nn.Module, ids: list[int]) -> dict[str, np.ndarray]:
    layers = _layers(model)
    seen: dict[str, np.ndarray] = {}

    def keep(key: str, value: Any) -> None:
        value = value[0] if isinstance(value, tuple) else value
        seen[key] = value[0].detach().numpy().astype(np.float32)

    handles = [layers[0].register_forward_pre_hook(lambda m, a, kw: keep("embed", a[0] if a else kw["hidden_states"]),
                                                   with_kwargs=True)]
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(lambda m, a, out, i=i: keep(f"resid_post.{i}", out)))
    # layer 0's q projection (+ bias), before any norm or rotation: a Linear of its own, or the
    # first n_heads * head_dim outputs of a fused one (Phi-3's qkv_proj, GPT-2's c_attn)
    attn = getattr(layers[0], "self_attn", None) or layers[0].attn
    proj = next(getattr(attn, n) for n in ("q_proj", "qkv_proj", "c_attn") if hasattr(attn, n))
    cfg = model.config
    q_out = cfg.num_attention_heads * (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    handles.append(proj.register_forward_hook(lambda m, a, out: keep("q0", out[..., :q_out])))
    experts: dict[str, list[np.ndarray]] = {}
    if cfg.model_type == "mixtral":
        handles += [layer.mlp.experts.register_forward_hook(lambda m, a, out: _each_expert(m, a, experts))
                    for layer in layers]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy().astype(np.float32)
    for h in handles:
        h.remove()
    out = {"ids": np.array(ids, dtype=np.int64), "logits": logits, "embed": seen["embed"], "q0": seen["q0"],
           "resid_post": np.stack([seen[f"resid_post.{i}"] for i in range(len(layers))])}
    return out | {key: np.stack(values) for key, values in experts.items()}


def _each_expert(module: torch.nn.Module, args: tuple[Any, ...], into: dict[str, list[np.ndarray]]) -> None:
    """Mixtral's experts module, run again by its own forward once per expert with weight 1 on the
    slots routed to that expert and 0 elsewhere: each expert's output before the router's weight,
    as transformers computes it, `(E, T, hidden)` (zero where the expert is not chosen); also the
    chosen experts `(T, k)` and their weights."""
    hidden, index, weights = args
    outs = [type(module).forward(module, hidden, index, (index == e).to(weights.dtype))
            for e in range(module.num_experts)]
    into.setdefault("expert_out", []).append(torch.stack(outs).numpy().astype(np.float32))
    into.setdefault("expert_index", []).append(index.numpy().astype(np.int64))
    into.setdefault("expert_weight", []).append(weights.numpy().astype(np.float32))


# references that also record a greedy generation through transformers' KV cache: (prompt 0's first
# n tokens, new tokens). phi3_longrope's crosses its original context of 32 at the 5th new token,
# where transformers' Phi-3 drops its cache and runs everything again with the long factors.
GENERATIONS = {"phi3_longrope": (28, 12)}


def _generate(model: torch.nn.Module, ids: list[int], new: int) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=EOS, eos_token_id=None)
    return {"gen.prompt": np.array(ids, dtype=np.int64),
            "gen.ids": out.sequences[0, len(ids):].numpy().astype(np.int64),
            "gen.scores": torch.stack(out.scores)[:, 0].numpy().astype(np.float32)}  # (new, vocab)


def build(name: str, seed: int = 0) -> Path:
    model_type, fields, what = ARCHITECTURES[name]
    torch.manual_seed(seed)
    cfg = _config(model_type, fields)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    _randomize(model, model_type, seed)
    directory = OUT / name
    if directory.exists():
        shutil.rmtree(directory)
    model.save_pretrained(directory)
    (directory / "generation_config.json").unlink(missing_ok=True)
    tok = build_tokenizer()
    tok.save(str(directory / "tokenizer.json"))
    arrays: dict[str, np.ndarray] = {}
    for p, text in enumerate(PROMPTS):
        for key, value in _run(model, tok.encode(text).ids).items():
            arrays[f"p{p}.{key}"] = value
    if name in GENERATIONS:
        n, new = GENERATIONS[name]
        arrays |= _generate(model, tok.encode(PROMPTS[0]).ids[:n], new)
    np.savez_compressed(OUT / f"{name}.npz", **arrays)
    (OUT / f"{name}.json").write_text(json.dumps({
        "architecture": name, "model_type": model_type, "exercises": what, "seed": seed, "prompts": PROMPTS,
        "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]}, indent=1) + "\n")
    return directory


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    for arch in sys.argv[1:] or ARCHITECTURES:
        print(arch, build(arch))
