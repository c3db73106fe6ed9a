"""The forward pass, top to bottom, for every architecture larql runs (Llama 2/3, Mistral, Qwen2/3,
Phi-3, Gemma 2/3, GPT-2); `ModelConfig` says what differs and each difference is one `if` here:
RMS norm or LayerNorm with a bias, RoPE or learned positions, q/k/v/o biases, q/k norms, sandwich
norms, soft-caps, gated or plain MLP (in ffn.py).

Activations are float32 `(T, hidden)` for the T new positions; the KV cache holds the earlier ones,
so prefill (T = prompt length) and decode (T = 1) are the same code. Every stage passes a named
hook point (TransformerLens names, see `hooks.py`); with no hooks the cost is one `if` per point.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from numpy.typing import NDArray

from larql.model import fused
from larql.model.attention import KVCache, RopeTable, apply_rope, attention
from larql.model.config import ModelConfig
from larql.model.ffn import FFN, FFNEdits
from larql.model.hooks import HookFns, LayerHookNames, layer_hook_names, run_hook
from larql.model.weights import LayerWeights, Weights

F32 = NDArray[np.float32]
Hooks = HookFns  # compiled hook functions: name -> fn(x, name, start), see hooks.compile_spec

def rms_norm(x: F32, weight: F32, eps: float) -> F32:
    """x `(..., n)` / rms(x) * weight; weight already includes Gemma's +1."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    n = x.shape[-1]
    fused.rms_norm_rows(x.reshape(-1, n), np.ascontiguousarray(weight, dtype=np.float32), np.float32(eps),
                        out.reshape(-1, n))
    return out


def layer_norm(x: F32, weight: F32, bias: F32 | None, eps: float) -> F32:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (GPT-2's LayerNorm), float32."""
    x = np.asarray(x, dtype=np.float32)
    mean = x.mean(axis=-1, keepdims=True)
    var = np.square(x - mean).mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + np.float32(eps)) * weight
    return y + bias if bias is not None else y


def norm(cfg: ModelConfig, x: F32, weight: F32, bias: F32 | None = None) -> F32:
    """The model's normalization: RMS norm, or LayerNorm (with its bias) when cfg.norm == "layer"."""
    if cfg.norm == "layer":
        return layer_norm(x, weight, bias, cfg.norm_eps)
    return rms_norm(x, weight, cfg.norm_eps)


class Forward:
    """Runs the layers of one model over a KV cache."""

    def __init__(self, cfg: ModelConfig, weights: Weights, edits: FFNEdits | None = None) -> None:
        self.cfg, self.w = cfg, weights
        self.ffn = FFN(cfg, weights, edits)  # edits: None for the dense FFN, else e.g. the vindex's overlay
        self.names: tuple[LayerHookNames, ...] = layer_hook_names(cfg.n_layers)
        self.ropes = {base: RopeTable(cfg.rope_inv_freq(base)) for base in {cfg.rope_base, cfg.rope_base_local}}

    def embed(self, ids: NDArray[np.int64], start: int) -> F32:
        x = self.w.token_embd.rows(ids)  # (T, hidden)
        if self.cfg.embed_scale != 1.0:
            x = x * np.float32(self.cfg.embed_scale)
        if self.w.pos_embd is not None:  # learned absolute positions (GPT-2)
            x = x + self.w.pos_embd.rows(np.arange(start, start + len(ids)))  # (T, hidden)
        return x

    def attention_block(self, i: int, lw: LayerWeights, x: F32, cache: KVCache, start: int,
                        hooks: Hooks | None) -> F32:
        cfg, n = self.cfg, self.names[i]
        t = x.shape[0]
        h = norm(cfg, x, lw.attn_norm, lw.attn_norm_bias)  # (T, hidden)
        q = lw.q.matmul(h)  # (T, n_heads * head_dim)
        k = lw.k.matmul(h)  # (T, n_kv * head_dim)
        v = lw.v.matmul(h)  # (T, n_kv * head_dim)
        if lw.q_bias is not None:
            assert lw.k_bias is not None and lw.v_bias is not None  # q, k and v biases come together
            q, k, v = q + lw.q_bias, k + lw.k_bias, v + lw.v_bias
        q = q.reshape(t, cfg.n_heads, cfg.head_dim)  # (T, n_heads, d)
        k = k.reshape(t, cfg.n_kv_heads, cfg.head_dim)  # (T, n_kv, d)
        v = v.reshape(t, cfg.n_kv_heads, cfg.head_dim)  # (T, n_kv, d)
        if hooks:  # TransformerLens's hook_q / hook_k: the projections, before q/k norm and rotation
            q, k, v = run_hook(hooks, n.q, q, start), run_hook(hooks, n.k, k, start), run_hook(hooks, n.v, v, start)
        if cfg.qk_norm:
            assert lw.q_norm is not None and lw.k_norm is not None  # qk_norm: the loader read both
            q = rms_norm(q, lw.q_norm, cfg.norm_eps)  # (T, n_heads, d)
            k = rms_norm(k, lw.k_norm, cfg.norm_eps)  # (T, n_kv, d)
        if cfg.positions == "rope":
            cos, sin = self.ropes[cfg.layer_rope_base(i)].get(start, start + t)  # (T, d/2)
            q = apply_rope(q, cos, sin, cfg.rope_interleaved)  # (T, n_heads, d)
            k = apply_rope(k, cos, sin, cfg.rope_interleaved)  # (T, n_kv, d)
            if hooks:
                q, k = run_hook(hooks, n.rot_q, q, start), run_hook(hooks, n.rot_k, k, start)
        keys, values = cache.write(i, start, k, v)  # (n_kv, S, d) each
        scores_hook = pattern_hook = None
        if hooks:
            if n.scores in hooks:
                scores_hook = partial(run_hook, hooks, n.scores, start=start)
            if n.pattern in hooks:
                pattern_hook = partial(run_hook, hooks, n.pattern, start=start)
        z = attention(q, keys, values, start, cfg.attn_scale, cfg.layer_window(i), cfg.attn_softcap,
                      scores_hook, pattern_hook)  # (T, n_heads*d)
        out = lw.o.matmul(z)  # (T, hidden)
        if lw.o_bias is not None:
            out = out + lw.o_bias
        if hooks:
            out = run_hook(hooks, n.attn_out, out, start)
        return out

    def mlp_block(self, i: int, lw: LayerWeights, x: F32, hooks: Hooks | None, start: int) -> F32:
        h = norm(self.cfg, x, lw.ffn_norm, lw.ffn_norm_bias)  # (T, hidden)
        return self.ffn(i, h, hooks, start)  # (T, hidden)

    def layer(self, i: int, x: F32, cache: KVCache, start: int, hooks: Hooks | None) -> F32:
        lw, n, eps = self.w.layers[i], self.names[i], self.cfg.norm_eps
        if hooks:
            x = run_hook(hooks, n.resid_pre, x, start)
        a = self.attention_block(i, lw, x, cache, start, hooks)  # (T, hidden)
        if lw.post_attn_norm is not None:
            a = rms_norm(a, lw.post_attn_norm, eps)
        x = x + a  # (T, hidden)
        if hooks:
            x = run_hook(hooks, n.resid_mid, x, start)
        m = self.mlp_block(i, lw, x, hooks, start)  # (T, hidden)
        if lw.post_ffn_norm is not None:
            m = rms_norm(m, lw.post_ffn_norm, eps)
        x = x + m  # (T, hidden)
        if hooks:
            x = run_hook(hooks, n.resid_post, x, start)
        return x

    def __call__(self, ids: NDArray[np.int64], cache: KVCache, hooks: Hooks | None = None,
                 all_logits: bool = False) -> F32:
        """Run positions cache.length.. for `ids`; logits `(T, vocab)` if all_logits else `(vocab,)` of the last."""
        start = cache.length
        cache.reserve(start + len(ids))
        x = self.embed(ids, start)  # (T, hidden)
        if hooks:
            x = run_hook(hooks, "hook_embed", x, start)
        for i in range(self.cfg.n_layers):
            x = self.layer(i, x, cache, start, hooks)
        cache.length = start + len(ids)
        x = norm(self.cfg, x if all_logits else x[-1], self.w.output_norm, self.w.output_norm_bias)  # (T|, hidden)
        if hooks:
            x = run_hook(hooks, "hook_final_norm", x, start)
        logits = self.w.output.matmul(x)  # (T|, vocab)
        if self.cfg.final_softcap:
            cap = np.float32(self.cfg.final_softcap)
            logits = np.tanh(logits / cap) * cap
        return logits
