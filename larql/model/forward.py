"""The forward pass, top to bottom, for every architecture larql runs (Llama 2/3, Mistral, Qwen2/3,
Phi-3, Gemma 2/3, GPT-2); `ModelConfig` says what differs and each difference is one `if` here:
RMS norm or LayerNorm with a bias, RoPE or learned positions, q/k/v/o biases, q/k norms, sandwich
norms, soft-caps, gated or plain MLP (in ffn.py).

Activations are float32 `(T, hidden)` for the T new positions; the KV cache holds the earlier ones,
so prefill (T = prompt length) and decode (T = 1) are the same code. Every stage passes a named
hook point (TransformerLens names, see `hooks.py`); with no hooks the cost is one `if` per point.

A batch of prompts is packed end to end, not padded: the T rows are several sequences (`Segment`s),
each with its own KV cache and start position. Everything but attention works row by row, so it runs
once on all rows (one pass over each weight for the whole batch); attention runs per segment, which
is the block-diagonal causal mask without computing the masked blocks. Hooks see one sequence's
positions, so a hooked pass is a single segment.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelError
from larql.model import fused
from larql.model.attention import KVCache, RopeTable, apply_rope, attention
from larql.model.busy import step_threads
from larql.model.config import ModelConfig
from larql.model.decode_layer import DecodeLayers
from larql.model.ffn import FFN, FFNEdits
from larql.model.hooks import HookFns, LayerHookNames, layer_hook_names, run_hook
from larql.model.segments import Segment, packed_segments, positions
from larql.model.weights import LayerWeights, Weights

F32 = NDArray[np.float32]
_NO_ROPE = np.zeros((1, 1), dtype=np.float32)  # cos/sin (and absent q/k norm weights) where unused
Hooks = HookFns  # compiled hook functions: name -> fn(x, name, start), see hooks.compile_spec


def rms_norm(x: F32, weight: F32, eps: float) -> F32:
    """x `(..., n)` / rms(x) * weight; weight already includes Gemma's +1."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    n = x.shape[-1]
    fused.rms_norm_rows(x.reshape(-1, n), np.ascontiguousarray(weight, dtype=np.float32), np.float32(eps),
                        out.reshape(-1, n))
    return out


def norm_rope(x: F32, weight: F32, eps: float, cos: F32, sin: F32, interleaved: bool) -> F32:
    """apply_rope(rms_norm(x, weight, eps), cos, sin, interleaved) of float32 x `(T, heads, d)`, the
    same bits (fused.norm_rope_rows), in one pass."""
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)  # (T, heads, d)
    fused.norm_rope_rows(x, np.ascontiguousarray(weight, dtype=np.float32).reshape(-1), np.float32(eps),
                         np.ascontiguousarray(cos, dtype=np.float32), np.ascontiguousarray(sin, dtype=np.float32),
                         bool(interleaved), out)
    return out


def add_normed(x: F32, a: F32, weight: F32 | None, eps: float) -> F32:
    """The residual x `(T, hidden)` plus a block's output a, RMS-normed first when weight is given
    (Gemma's sandwich norms): `x + rms_norm(a, weight, eps)`, the same bits, in one pass."""
    if weight is None:
        return x + a
    if not (x.dtype == a.dtype == np.float32 and x.shape == a.shape and x.ndim == 2):
        return x + rms_norm(a, weight, eps)
    out = np.empty_like(x)  # (T, hidden)
    fused.add_rms_norm_rows(np.ascontiguousarray(x), np.ascontiguousarray(a), np.ascontiguousarray(weight, dtype=np.float32),
                            np.float32(eps), out)
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

    fused_decode = True  # a decode step's attention in two numba calls (decode_attention); tests compare both

    def __init__(self, cfg: ModelConfig, weights: Weights, edits: FFNEdits | None = None) -> None:
        self.cfg, self.w = cfg, weights
        self.ffn = FFN(cfg, weights, edits)  # edits: None for the dense FFN, else e.g. the vindex's overlay
        self.names: tuple[LayerHookNames, ...] = layer_hook_names(cfg.n_layers)
        self._decode_layers: DecodeLayers | None = None  # made at the first decode step
        # per (base, long): longrope's long factors get a table of their own
        self.ropes = {(base, long): RopeTable(cfg.rope_inv_freq(base, long),
                                              cfg.rope_attn_factor if base == cfg.rope_base else 1.0)
                      for base in {cfg.rope_base, cfg.rope_base_local}
                      for long in {False, cfg.rope_scaling == "longrope"}}

    def embed(self, ids: NDArray[np.int64], segs: list[Segment]) -> F32:
        x = self.w.token_embd.rows(ids)  # (T, hidden)
        if self.cfg.embed_scale != 1.0:
            x = x * np.float32(self.cfg.embed_scale)
        if self.w.pos_embd is not None:  # learned absolute positions (GPT-2)
            x = x + self.w.pos_embd.rows(positions(segs))  # (T, hidden)
        return x

    def rope(self, layer: int, segs: list[Segment]) -> tuple[F32, F32]:
        """cos, sin `(T, d/2)` of every row's position under layer `layer`'s rope base."""
        base = self.cfg.layer_rope_base(layer)
        if len(segs) == 1:
            s = segs[0]
            stop = s.start + s.hi - s.lo
            return self.ropes[base, self.cfg.long_rope(stop)].get(s.start, stop)
        parts = [self.ropes[base, self.cfg.long_rope(stop)].get(s.start, stop)
                 for s in segs for stop in (s.start + s.hi - s.lo,)]
        return np.concatenate([c for c, _ in parts]), np.concatenate([sn for _, sn in parts])

    def attention_block(self, i: int, lw: LayerWeights, x: F32, segs: list[Segment], hooks: Hooks | None) -> F32:
        cfg, n = self.cfg, self.names[i]
        t, start = x.shape[0], segs[0].start  # start: the hooks' (a hooked pass is one segment)
        h = norm(cfg, x, lw.attn_norm, lw.attn_norm_bias)  # (T, hidden)
        q = lw.q.matmul(h)  # (T, n_heads * head_dim)
        k = lw.k.matmul(h)  # (T, n_kv * head_dim)
        v = lw.v.matmul(h)  # (T, n_kv * head_dim)
        if lw.q_bias is not None:
            assert lw.k_bias is not None and lw.v_bias is not None  # q, k and v biases come together
            q, k, v = q + lw.q_bias, k + lw.k_bias, v + lw.v_bias
        if t == 1 and not hooks and len(segs) == 1 and self.fused_decode:  # decode: norms, RoPE, cache, attention in 2 calls
            z = self.decode_attention(i, lw, q, k, v, segs[0])  # (1, n_heads*d)
            return self.output_projection(i, lw, z, hooks, start)
        q = q.reshape(t, cfg.n_heads, cfg.head_dim)  # (T, n_heads, d)
        k = k.reshape(t, cfg.n_kv_heads, cfg.head_dim)  # (T, n_kv, d)
        v = v.reshape(t, cfg.n_kv_heads, cfg.head_dim)  # (T, n_kv, d)
        if hooks:  # TransformerLens's hook_q / hook_k: the projections, before q/k norm and rotation
            q, k, v = run_hook(hooks, n.q, q, start), run_hook(hooks, n.k, k, start), run_hook(hooks, n.v, v, start)
        rope = cfg.positions == "rope"
        cos, sin = self.rope(i, segs) if rope else (_NO_ROPE, _NO_ROPE)  # (T, d/2)
        q_norm, k_norm = (lw.q_norm, lw.k_norm) if cfg.qk_norm else (None, None)
        if cfg.qk_norm:
            assert q_norm is not None and k_norm is not None  # qk_norm: the loader read both
        if q_norm is not None and k_norm is not None and rope and q.dtype == k.dtype == np.float32:  # one pass each
            q = norm_rope(q, q_norm, cfg.norm_eps, cos, sin, cfg.rope_interleaved)  # (T, n_heads, d) normed, rotated
            k = norm_rope(k, k_norm, cfg.norm_eps, cos, sin, cfg.rope_interleaved)  # (T, n_kv, d)
        else:
            if q_norm is not None and k_norm is not None:
                q = rms_norm(q, q_norm, cfg.norm_eps)  # (T, n_heads, d)
                k = rms_norm(k, k_norm, cfg.norm_eps)  # (T, n_kv, d)
            if rope:
                q = apply_rope(q, cos, sin, cfg.rope_interleaved)  # (T, n_heads, d)
                k = apply_rope(k, cos, sin, cfg.rope_interleaved)  # (T, n_kv, d)
        if rope and hooks:
            q, k = run_hook(hooks, n.rot_q, q, start), run_hook(hooks, n.rot_k, k, start)
        scores_hook = pattern_hook = None
        if hooks:
            if n.scores in hooks:
                scores_hook = partial(run_hook, hooks, n.scores, start=start)
            if n.pattern in hooks:
                pattern_hook = partial(run_hook, hooks, n.pattern, start=start)
        window = cfg.layer_window(i)
        if len(segs) == 1:
            keys, values = segs[0].cache.write(i, start, k, v)  # (n_kv, S, d) each
            z = attention(q, keys, values, start, cfg.attn_scale, window, cfg.attn_softcap,
                          scores_hook, pattern_hook)  # (T, n_heads*d)
        else:  # each sequence attends to its own keys only
            z = np.empty((t, cfg.n_heads * cfg.head_dim), dtype=np.float32)  # (T, n_heads*d)
            for s in segs:
                keys, values = s.cache.write(i, s.start, k[s.lo:s.hi], v[s.lo:s.hi])  # (n_kv, S_s, d) each
                z[s.lo:s.hi] = attention(q[s.lo:s.hi], keys, values, s.start, cfg.attn_scale, window,
                                         cfg.attn_softcap)  # (T_s, n_heads*d)
        return self.output_projection(i, lw, z, hooks, start)

    def output_projection(self, i: int, lw: LayerWeights, z: F32, hooks: Hooks | None, start: int) -> F32:
        """Layer i's attention output `(T, hidden)` from the heads' z `(T, n_heads*d)`."""
        out = lw.o.matmul(z)  # (T, hidden)
        if lw.o_bias is not None:
            out = out + lw.o_bias
        if hooks:
            out = run_hook(hooks, self.names[i].attn_out, out, start)
        return out

    def decode_attention(self, i: int, lw: LayerWeights, q: F32, k: F32, v: F32, seg: Segment) -> F32:
        """The attention of one new position (no hooks): q `(1, n_heads*d)`, k, v `(1, n_kv*d)` after
        their biases -> `(1, n_heads*d)`, with k and v appended to the cache (fused.decode_qk, then
        fused.attend_one: the same operations as the general path below)."""
        cfg, start = self.cfg, seg.start
        d = cfg.head_dim
        rope = cfg.positions == "rope"
        cos, sin = self.rope(i, [seg]) if rope else (_NO_ROPE, _NO_ROPE)  # (1, d/2)
        window = cfg.layer_window(i)
        qr = np.empty((cfg.n_heads, d), dtype=np.float32)  # (n_heads, d) normed, rotated
        none = _NO_ROPE[0]
        keys, values = seg.cache.k[i], seg.cache.v[i]  # (n_kv, capacity, d)
        fused.decode_qk(
            np.ascontiguousarray(q, dtype=np.float32).reshape(cfg.n_heads, d),
            np.ascontiguousarray(k, dtype=np.float32).reshape(cfg.n_kv_heads, d),
            np.ascontiguousarray(v, dtype=np.float32).reshape(cfg.n_kv_heads, d),
            _vec(lw.q_norm) if cfg.qk_norm else none, _vec(lw.k_norm) if cfg.qk_norm else none, bool(cfg.qk_norm),
            np.float32(cfg.norm_eps), np.ascontiguousarray(cos[0]), np.ascontiguousarray(sin[0]), rope,
            bool(cfg.rope_interleaved), keys, values, start, qr)
        out = np.empty((cfg.n_heads, d), dtype=np.float32)  # (n_heads, d)
        fused.attend_one(qr, keys, values, max(0, start - window + 1) if window else 0, start + 1,
                         np.float32(cfg.attn_scale), np.float32(cfg.attn_softcap or 0.0), out)
        return out.reshape(1, cfg.n_heads * d)

    def mlp_block(self, i: int, lw: LayerWeights, x: F32, hooks: Hooks | None, start: int) -> F32:
        h = norm(self.cfg, x, lw.ffn_norm, lw.ffn_norm_bias)  # (T, hidden)
        return self.ffn(i, h, hooks, start)  # (T, hidden)

    def layer(self, i: int, x: F32, segs: list[Segment], hooks: Hooks | None) -> F32:
        lw, n, eps, start = self.w.layers[i], self.names[i], self.cfg.norm_eps, segs[0].start
        if hooks:
            x = run_hook(hooks, n.resid_pre, x, start)
        a = self.attention_block(i, lw, x, segs, hooks)  # (T, hidden)
        x = add_normed(x, a, lw.post_attn_norm, eps)  # (T, hidden) x + norm(a), or x + a
        if hooks:
            x = run_hook(hooks, n.resid_mid, x, start)
        m = self.mlp_block(i, lw, x, hooks, start)  # (T, hidden)
        x = add_normed(x, m, lw.post_ffn_norm, eps)  # (T, hidden)
        if hooks:
            x = run_hook(hooks, n.resid_post, x, start)
        return x

    def __call__(self, ids: NDArray[np.int64], cache: KVCache, hooks: Hooks | None = None,
                 all_logits: bool = False) -> F32:
        """Run positions cache.length.. for `ids`; logits `(T, vocab)` if all_logits else `(vocab,)` of the last."""
        start = cache.length
        x = self.run([Segment(0, len(ids), cache, start)], ids, hooks)  # (T, hidden)
        with step_threads(len(x) if all_logits else 1):  # the lm_head too (busy.py)
            return self.logits(x if all_logits else x[-1], hooks, start)

    def batch(self, ids: list[NDArray[np.int64]], caches: list[KVCache], rows: NDArray[np.int64] | None = None) -> F32:
        """Each sequence `ids[b]` run after what `caches[b]` holds, all in one packed pass (no hooks):
        logits `(len(rows), vocab)` of the packed rows `rows` (sequence b's rows follow sequence
        b-1's), of every row if None."""
        _, segs = packed_segments(ids, caches)
        x = self.run(segs, np.concatenate(ids), None)  # (sum T_b, hidden)
        return self.logits(x if rows is None else x[rows], None, 0)  # (rows, vocab)

    def batch_top1(self, ids: list[NDArray[np.int64]], caches: list[KVCache]) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """`batch` at each sequence's last row, reduced to the greedy token and its log-probability
        `(B,)` each, the lm_head a chunk of the vocabulary at a time (QuantMatrix.top1)."""
        bounds, segs = packed_segments(ids, caches)
        x = self.run(segs, np.concatenate(ids), None)  # (sum T_b, hidden)
        return self.w.output.top1(self.final_norm(x[bounds[1:] - 1], None, 0), self.cfg.final_softcap)

    def observe(self, ids: list[NDArray[np.int64]], caches: list[KVCache], names: set[str], last_layer: int,
                first_layer: int = 0, resid: F32 | None = None) -> dict[str, F32]:
        """The activations at `names` (hook points of layers <= `last_layer`, none inside attention)
        of the packed sequences `ids`, each `(sum T_b, ...)` in packing order; the pass stops after
        `last_layer`, and starts at `first_layer` from `resid` `(sum T_b, hidden)`, the residual
        entering it, where given. Nothing is changed but the caches, which get the keys and values of
        the layers run (their lengths stay: a caller forks what it keeps, `Model.capture_batch`)."""
        _, segs = packed_segments(ids, caches)
        for s in segs:
            s.cache.reserve(s.start + s.hi - s.lo)
        got: dict[str, F32] = {}

        def keep(x: F32, name: str, start: int) -> None:
            got[name] = np.array(x, dtype=np.float32, copy=True)

        hooks: Hooks = {n: keep for n in names}
        x = self.embed(np.concatenate(ids), segs) if resid is None else resid  # (sum T_b, hidden)
        for i in range(first_layer if resid is not None else 0, last_layer + 1):
            x = self.layer(i, x, segs, hooks)
        return got

    def run(self, segs: list[Segment], ids: NDArray[np.int64], hooks: Hooks | None) -> F32:
        """The final residual `(T, hidden)` of the packed rows `ids`; each segment's cache grows by its rows."""
        assert not hooks or len(segs) == 1  # hooks address one sequence's positions
        keep: NDArray[np.int64] | None = None
        if self.cfg.rope_scaling == "longrope":
            segs, ids, keep = self.rewind_longrope(segs, ids)
        for s in segs:
            s.cache.reserve(s.start + s.hi - s.lo)
        x = self.embed(ids, segs)  # (T, hidden)
        if hooks:
            x = run_hook(hooks, "hook_embed", x, segs[0].start)
        with step_threads(len(ids)):  # one thread for a decode step on a busy machine (busy.py)
            plan = self.decode_layers() if len(ids) == 1 and len(segs) == 1 and not hooks else None
            if plan is None:
                for i in range(self.cfg.n_layers):
                    x = self.layer(i, x, segs, hooks)
            else:  # a decode step: the plain layers by direct kernel calls (decode_layer.py)
                x = self.decode_step(plan, x, segs[0])
        for s in segs:
            s.cache.length = s.start + s.hi - s.lo
            if self.cfg.rope_scaling == "longrope":
                s.cache.ids = np.concatenate([s.cache.ids[:s.start], ids[s.lo:s.hi]])
                s.cache.rope_long = self.cfg.long_rope(s.cache.length)
        return x if keep is None else x[keep]

    def decode_step(self, plan: DecodeLayers, x: F32, s: Segment) -> F32:
        """The layers of a one-position pass without hooks, those `plan` covers by its direct calls,
        the rest by `layer`: the final residual `(1, hidden)`."""
        x = np.array(x, dtype=np.float32, order="C")  # (1, hidden), updated in place
        ropes: dict[float, tuple[F32, F32]] = {}
        with np.errstate(over="ignore"):  # SiLU's exp(-x) = inf far below 0 (DecodeLayers.run)
            for i in range(self.cfg.n_layers):
                if not plan.covers(i):
                    x = self.layer(i, x, [s], None)
                    continue
                base = self.cfg.layer_rope_base(i)
                if base not in ropes:
                    cos, sin = self.rope(i, [s]) if self.cfg.positions == "rope" else (_NO_ROPE, _NO_ROPE)
                    ropes[base] = (np.ascontiguousarray(cos[0]), np.ascontiguousarray(sin[0]))  # (d/2,) each
                plan.run(i, x, s.cache.k[i], s.cache.v[i], s.start, *ropes[base])
        return x

    def decode_layers(self) -> DecodeLayers | None:
        """The plan a decode step runs its plain layers by (None: the general path for every layer:
        `fused_decode` off, FFN edits, which the general path applies, or an FFN block replaced by
        `Model.with_ffn`, e.g. one served over HTTP, which only the general path calls)."""
        if not self.fused_decode or type(self.ffn) is not FFN or self.ffn.edits is not None:
            return None
        if self._decode_layers is None:
            self._decode_layers = DecodeLayers(self.cfg, self.w.layers)
        return self._decode_layers

    def rewind_longrope(self, segs: list[Segment], ids: NDArray[np.int64]
                        ) -> tuple[list[Segment], NDArray[np.int64], NDArray[np.int64] | None]:
        """Segments whose cached keys were rotated with the other longrope factors than this pass
        needs (short ones, and the pass now reaches past the original context; or long ones in a
        cache forked back to a short prefix) start again from position 0, their cached ids first,
        so that every position uses one set of factors (what transformers' Phi-3 generation does:
        it drops the cache at the crossing). Returns the segments, the packed ids and which rows
        are the caller's (None: all, nothing rewound)."""
        def stale(s: Segment) -> bool:
            return s.start > 0 and s.cache.rope_long != self.cfg.long_rope(s.start + s.hi - s.lo)

        if not any(stale(s) for s in segs):
            return segs, ids, None
        new_segs, parts, keep, row = [], [], [], 0
        for s in segs:
            own = ids[s.lo:s.hi]
            start = s.start
            if stale(s):
                if len(s.cache.ids) < start:
                    raise ModelError(f"longrope: this KV cache holds {start} positions but not their token ids; "
                                     f"run the whole sequence again")
                own, start = np.concatenate([s.cache.ids[:start], own]), 0
            new_segs.append(Segment(row, row + len(own), s.cache, start))
            parts.append(own)
            keep.append(np.arange(row + len(own) - (s.hi - s.lo), row + len(own)))
            row += len(own)
        return new_segs, np.concatenate(parts), np.concatenate(keep)

    def next_token(self, ids: NDArray[np.int64], cache: KVCache, hooks: Hooks | None = None) -> int:
        """Greedy decoding's step: `int(np.argmax(self(ids, cache, hooks)))`, the same id always, without
        computing every logit where the lm_head allows (QuantMatrix.argmax_matvec)."""
        start = cache.length
        x = self.run([Segment(0, len(ids), cache, start)], ids, hooks)  # (T, hidden)
        if self.cfg.final_softcap:  # tanh may round distinct logits to ties: take them all
            with step_threads(1):
                return int(np.argmax(self.logits(x[-1], hooks, start)))
        with step_threads(1):  # the lm_head too (busy.py)
            return self.w.output.argmax_matvec(self.final_norm(x[-1], hooks, start))  # (hidden,) -> id

    def final_norm(self, x: F32, hooks: Hooks | None, start: int) -> F32:
        """The final norm (and its hook) of residual rows x `(T|, hidden)`."""
        x = norm(self.cfg, x, self.w.output_norm, self.w.output_norm_bias)  # (T|, hidden)
        if hooks:
            x = run_hook(hooks, "hook_final_norm", x, start)
        return x

    def logits(self, x: F32, hooks: Hooks | None, start: int) -> F32:
        """The final norm and lm_head (and soft-cap) of residual rows x `(T|, hidden)`: `(T|, vocab)`."""
        x = self.final_norm(x, hooks, start)  # (T|, hidden)
        logits = self.w.output.matmul(x)  # (T|, vocab)
        if self.cfg.final_softcap:
            cap = np.float32(self.cfg.final_softcap)
            logits = np.tanh(logits / cap) * cap
        return logits


def _vec(w: F32 | None) -> F32:
    assert w is not None  # qk_norm: the loader read both
    return np.ascontiguousarray(w, dtype=np.float32).reshape(-1)
