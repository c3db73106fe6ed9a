"""Gradients through the top of the model, for the value step of ROME/MEMIT-style weight edits.

A weight edit of layer L's down projection changes the MLP output at the subject's last token. To
choose that change, ROME optimises a vector delta added there so that the target wins; that needs
d loss / d delta through every layer above L, at the positions from the subject onwards. There is
no autograd in larql's stack (numpy + numba), so this module writes the backward pass by hand —
exact, not an approximation (tests check it against finite differences) — for what `Forward`
runs: RMS norms (Gemma's sandwich and q/k norms included), RoPE in both layouts, grouped-query
causal attention with sliding windows and soft-capping, GELU-tanh / SiLU gated MLPs, the final
norm and the unembedding.

Three things keep it cheap on a CPU:
- it works on dense float32 copies of the layers it touches (`DenseLayer`), made once per model;
- positions before the subject do not depend on delta, so their keys and values are computed once
  (`TailContext.prefix_kv`) and only the suffix runs per step — all contexts' suffix rows in one
  matmul, their attention by numba loops over the stacked rows (`packed_attention`);
- the loss reads logits only over a candidate set of tokens (the targets plus every token that
  was likely at a scored position before the edit), so the 262k-row unembedding is not touched
  per step. Callers re-check the result with the real forward pass.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from larql.errors import UnsupportedError
from larql.model import packed_attention as packed
from larql.model.activation_grad import gated_and_grad
from larql.model.attention import RopeTable, apply_rope
from larql.model.config import ModelConfig
from larql.model.weights import LayerWeights, Weights

F32 = NDArray[np.float32]
I64 = NDArray[np.int64]

# (gate, up, down) dense float32 matrices `(ffn, hidden)`, `(ffn, hidden)`, `(hidden, ffn)` of a layer's
# FFN as the model runs it now (edits included); None: the stored weights
FFNMatrices = Callable[[int], tuple[F32, F32, F32] | None]
# Prefixes sharing at least this many leading tokens run those once (`Tail.prepare`)
MIN_STEM = 4


# -- elementwise pieces and their derivatives -------------------------------------------------------


def _rms(x: F32, w: F32, eps: float) -> tuple[F32, F32, F32]:
    """y = x / rms(x) * w over the last axis; also returns (x / rms, 1 / rms) for the backward."""
    inv = (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))).astype(np.float32)
    n = x * inv
    return n * w, n, inv


def _rms_back(dy: F32, w: F32, n: F32, inv: F32) -> F32:
    dn = dy * w
    return (dn - n * np.mean(dn * n, axis=-1, keepdims=True)) * inv


# -- dense layers -------------------------------------------------------------------------------------


@dataclass
class DenseLayer:
    """One layer's weights as float32 arrays `(out, in)`; norms already carry Gemma's +1."""

    attn_norm: F32
    q: F32
    k: F32
    v: F32
    o: F32
    ffn_norm: F32
    gate: F32
    up: F32
    down: F32
    q_bias: F32 | None
    k_bias: F32 | None
    v_bias: F32 | None
    q_norm: F32 | None
    k_norm: F32 | None
    post_attn_norm: F32 | None
    post_ffn_norm: F32 | None

    @staticmethod
    def of(lw: LayerWeights, ffn: tuple[F32, F32, F32] | None = None) -> DenseLayer:
        if ffn is None:
            # require_backward refuses a model without a gated dense FFN
            assert lw.gate is not None and lw.up is not None and lw.down is not None
            ffn = (lw.gate.dense(), lw.up.dense(), lw.down.dense())
        gate, up, down = ffn
        # the weights' own kept float32 copies (read-only): every Tail and every model sharing these
        # weights uses the same arrays, and the model's batched passes read them too
        return DenseLayer(lw.attn_norm, lw.q.dense(), lw.k.dense(), lw.v.dense(), lw.o.dense(),
                          lw.ffn_norm, gate, up, down, lw.q_bias, lw.k_bias, lw.v_bias, lw.q_norm, lw.k_norm,
                          lw.post_attn_norm, lw.post_ffn_norm)


# -- one context: a token sequence whose positions from `start` on depend on the injected vectors ------


@dataclass
class TailContext:
    """A prompt run through the tail. Positions `start..` are recomputed each step; `resid` is the
    residual entering the first tail layer's MLP (its `hook_resid_mid`) at those positions."""

    ids: I64  # (T,) the whole sequence, for positions
    start: int  # first position the injected vectors reach (the subject's last token)
    resid: F32  # (T - start, hidden)
    inject_rows: I64 = field(default_factory=lambda: np.zeros(1, np.int64))  # rows of the suffix that get delta
    group: int = 0  # which row of a `(G, hidden)` delta this context receives (several edits in one pass)
    prefix_kv: list[tuple[F32, F32]] = field(default_factory=list)  # per tail layer above the first: (K, V) `(start, n_kv, d)`
    first_mlp: F32 | None = None  # (n, hidden) the first tail layer's MLP output, which no delta changes

    @property
    def n(self) -> int:
        return len(self.ids) - self.start


def _inject(ctxs: Sequence[TailContext], offsets: I64) -> tuple[I64, I64]:
    """The stacked rows that receive a delta, and the group of each."""
    rows = np.concatenate([off + c.inject_rows for off, c in zip(offsets, ctxs)]).astype(np.int64)
    groups = np.concatenate([np.full(len(c.inject_rows), c.group, np.int64) for c in ctxs])
    return rows, groups


@dataclass
class _Saved:
    """What one layer's forward keeps for its backward (over the stacked suffix rows)."""

    x_in: F32 | None = None
    attn: dict[str, object] = field(default_factory=dict)
    mlp: dict[str, object] = field(default_factory=dict)


def require_backward(cfg: ModelConfig, weights: Weights) -> None:
    """Raise UnsupportedError unless this module's backward pass covers every part of the model."""
    biased = any(getattr(lw, b) is not None for lw in weights.layers
                 for b in ("o_bias", "gate_bias", "up_bias", "down_bias"))
    unsupported = ("mixture of experts" if cfg.n_experts else "LayerNorm" if cfg.norm != "rms"
                   else "learned positions" if cfg.positions != "rope" else "an MLP without a gate" if not cfg.gated_mlp
                   else "output or MLP biases" if biased else "")
    if unsupported:  # the hand-written backward below has no terms for these
        hint = ("; use INSERT ... METHOD FEATURE" + (" (it takes a feature of the expert the router picks)"
                                                      if cfg.n_experts else "")) if cfg.gated_mlp else ""
        raise UnsupportedError(f"weight edits (ROME/MEMIT) cannot run on {cfg.arch}: its {unsupported} has "
                               f"no backward pass in larql yet{hint}")


class Tail:
    """Layers `first..` of a model as a differentiable function of vectors added to some of their MLP
    outputs (before Gemma's post-FFN norm) at the subject rows of each context."""

    def __init__(self, cfg: ModelConfig, weights: Weights, first: int, ffn: FFNMatrices | None = None,
                 layers: dict[int, DenseLayer] | None = None) -> None:
        require_backward(cfg, weights)
        self.cfg, self.w, self.first = cfg, weights, first
        self._ropes: dict[float, RopeTable] = {}
        self._packed: tuple[tuple[tuple[int, int], ...], packed.Packing] = ((), packed.pack([], []))
        self.layers = layers if layers is not None else {}
        for i in range(first, cfg.n_layers):
            if i not in self.layers:
                self.layers[i] = DenseLayer.of(weights.layers[i], ffn(i) if ffn is not None else None)

    # -- attention -----------------------------------------------------------------------------

    def _qkv(self, i: int, dl: DenseLayer, h: F32, positions: I64) -> tuple[F32, F32, F32, dict[str, object]]:
        cfg = self.cfg
        t = h.shape[0]
        q = h @ dl.q.T  # (T, n_heads*d)
        k = h @ dl.k.T  # (T, n_kv*d)
        v = h @ dl.v.T
        if dl.q_bias is not None:
            assert dl.k_bias is not None and dl.v_bias is not None  # q, k and v biases come together
            q, k, v = q + dl.q_bias, k + dl.k_bias, v + dl.v_bias
        q = q.reshape(t, cfg.n_heads, cfg.head_dim)
        k = k.reshape(t, cfg.n_kv_heads, cfg.head_dim)
        v = v.reshape(t, cfg.n_kv_heads, cfg.head_dim)
        saved: dict[str, object] = {}
        if cfg.qk_norm:
            assert dl.q_norm is not None and dl.k_norm is not None
            q, saved["qn"], saved["qinv"] = _rms(q, dl.q_norm, cfg.norm_eps)
            k, saved["kn"], saved["kinv"] = _rms(k, dl.k_norm, cfg.norm_eps)
        base = cfg.layer_rope_base(i)
        if cfg.long_rope(int(positions.max()) + 1):  # contexts are packed: one table must fit them all
            raise UnsupportedError(f"weight edits on {cfg.arch}: contexts past longrope's original context "
                                   f"({cfg.rope_original_context} tokens) are not supported")
        table = self._ropes.setdefault(base, RopeTable(cfg.rope_inv_freq(base),
                                                       cfg.rope_attn_factor if base == cfg.rope_base else 1.0))
        whole_cos, whole_sin = table.get(0, int(positions.max()) + 1)  # grown to cover every position
        cos, sin = whole_cos[positions], whole_sin[positions]  # (T, d/2)
        saved["cos"], saved["sin"] = cos, sin
        return apply_rope(q, cos, sin, cfg.rope_interleaved), apply_rope(k, cos, sin, cfg.rope_interleaved), v, saved

    def _qkv_back(self, dl: DenseLayer, h: F32, saved: dict[str, object], dq: F32, dk: F32, dv: F32) -> F32:
        cfg = self.cfg
        cos, sin = saved["cos"], saved["sin"]
        # a rotation's backward is the inverse rotation: the same rope with -sin
        dq = apply_rope(dq, cos, -sin, cfg.rope_interleaved)  # type: ignore[arg-type, operator]
        dk = apply_rope(dk, cos, -sin, cfg.rope_interleaved)  # type: ignore[arg-type, operator]
        if cfg.qk_norm:
            dq = _rms_back(dq, dl.q_norm, saved["qn"], saved["qinv"])  # type: ignore[arg-type]
            dk = _rms_back(dk, dl.k_norm, saved["kn"], saved["kinv"])  # type: ignore[arg-type]
        t = h.shape[0]
        return dq.reshape(t, -1) @ dl.q + dk.reshape(t, -1) @ dl.k + dv.reshape(t, -1) @ dl.v  # (T, hidden)

    # -- whole layers over the stacked suffixes ------------------------------------------------

    def _packing(self, ctxs: Sequence[TailContext]) -> packed.Packing:
        """Where the contexts' rows and prefix keys sit (they depend on the contexts' lengths and starts
        alone), kept while the same come back (a value step's active subjects change only when one
        finishes)."""
        key = tuple((c.start, len(c.ids)) for c in ctxs)
        if self._packed[0] != key:
            self._packed = (key, packed.pack([c.start for c in ctxs], [len(c.ids) for c in ctxs]))
        return self._packed[1]

    def _attention(self, i: int, dl: DenseLayer, x: F32, ctxs: Sequence[TailContext], slot: int,
                   sv: _Saved, keep: I64 | None = None) -> F32:
        """The attention block's output at every stacked row, or at the rows `keep` alone (every row's
        keys and values are still computed: the kept rows attend to them)."""
        cfg = self.cfg
        h, hn, hinv = _rms(x, dl.attn_norm, cfg.norm_eps)
        positions = np.concatenate([np.arange(c.start, len(c.ids)) for c in ctxs])
        q, k, v, qkv_saved = self._qkv(i, dl, h, positions)  # (N, H, d), (N, n_kv, d), (N, n_kv, d)
        packing = self._packing(ctxs)
        pk = np.concatenate([c.prefix_kv[slot][0] for c in ctxs])  # (P, n_kv, d)
        pv = np.concatenate([c.prefix_kv[slot][1] for c in ctxs])
        z, saved = packed.attend(packing, q, k, v, pk, pv, cfg.layer_window(i) or 0, cfg.attn_scale,
                                 cfg.attn_softcap or 0.0)  # (N, H*d)
        if keep is not None:
            z = z[keep]  # (K, H*d)
        a = z @ dl.o.T  # (N or K, hidden)
        sv.attn = {"h": h, "hn": hn, "hinv": hinv, "qkv": qkv_saved, "packing": packing, "saved": saved, "keep": keep}
        if dl.post_attn_norm is not None:
            a, sv.attn["an"], sv.attn["ainv"] = _rms(a, dl.post_attn_norm, cfg.norm_eps)
        return a

    def _attention_back(self, dl: DenseLayer, da: F32, sv: _Saved) -> F32:
        cfg, s = self.cfg, sv.attn
        if dl.post_attn_norm is not None:
            da = _rms_back(da, dl.post_attn_norm, s["an"], s["ainv"])  # type: ignore[arg-type]
        dz = da @ dl.o  # (N or K, H*d)
        keep = s["keep"]
        if keep is not None:  # the rows not kept passed nothing on: their gradient is zero
            full = np.zeros((len(s["h"]), dz.shape[1]), np.float32)  # type: ignore[arg-type]
            full[keep] = dz  # type: ignore[call-overload]
            dz = full
        dq, dk, dv = packed.attend_back(s["packing"], dz, s["saved"], cfg.attn_scale)  # type: ignore[arg-type]
        dh = self._qkv_back(dl, s["h"], s["qkv"], dq, dk, dv)  # type: ignore[arg-type]
        return _rms_back(dh, dl.attn_norm, s["hn"], s["hinv"])  # type: ignore[arg-type]

    def _mlp(self, dl: DenseLayer, x: F32, sv: _Saved) -> F32:
        h, hn, hinv = _rms(x, dl.ffn_norm, self.cfg.norm_eps)
        g = h @ dl.gate.T  # (N, ffn)
        u = h @ dl.up.T
        p, a, ud = gated_and_grad(self.cfg.activation, g, u)  # act(g) u, act(g), act'(g) u: (N, ffn) each
        sv.mlp = {"h": h, "hn": hn, "hinv": hinv, "a": a, "ud": ud}
        return p @ dl.down.T  # (N, hidden), before any post-FFN norm

    def _mlp_back(self, dl: DenseLayer, dm: F32, sv: _Saved) -> F32:
        s = sv.mlp
        dact = dm @ dl.down  # (N, ffn)
        dg = dact * s["ud"]  # type: ignore[operator]
        du = dact * s["a"]  # type: ignore[operator]
        dh = dg @ dl.gate + du @ dl.up
        return _rms_back(dh, dl.ffn_norm, s["hn"], s["hinv"])  # type: ignore[arg-type]

    # -- the tail ------------------------------------------------------------------------------

    def prepare(self, ctxs: Sequence[TailContext], full_resid: Sequence[F32]) -> None:
        """Fill each context's prefix keys/values for the layers above `first`, from the residual
        entering `first`'s MLP at its positions (`full_resid[c]`, `(T, hidden)`), with nothing
        injected. Positions before the subject see nothing after them (causal), so only those run:
        each distinct prefix once, and the leading part it shares with another prefix (a model-written
        prefix and the template's words before the subject: most of its rows) once for all of them —
        those stems first, then each prefix's other rows after its stem's keys and values."""
        empty = np.zeros((0, self.cfg.n_kv_heads, self.cfg.head_dim), np.float32)
        none = [(empty, empty)] * (self.cfg.n_layers - self.first - 1)
        prefixes = [tuple(c.ids[: c.start].tolist()) for c in ctxs]
        first_of: dict[tuple[int, ...], int] = {}
        for j, prefix in enumerate(prefixes):
            first_of.setdefault(prefix, j)
        distinct = sorted(p for p in first_of if p)
        stem = dict.fromkeys(distinct, 0)  # the longest part each shares with another (sorted: a neighbour)
        for a, b in itertools.pairwise(distinct):
            n = next((i for i, (u, w) in enumerate(zip(a, b)) if u != w), min(len(a), len(b)))
            if n >= MIN_STEM:
                stem[a], stem[b] = max(stem[a], n), max(stem[b], n)
        stems: dict[tuple[int, ...], int] = {}  # stem -> a context that starts with it
        for p in distinct:
            if stem[p]:
                stems.setdefault(p[: stem[p]], first_of[p])
        stem_kv = dict(zip(stems, self._prefix_kv([TailContext(np.asarray(s, np.int64), 0, full_resid[j][: len(s)],
                                                               prefix_kv=none) for s, j in stems.items()])))
        rest = [p for p in distinct if stem[p] < len(p)]
        rest_kv = dict(zip(rest, self._prefix_kv([TailContext(np.asarray(p, np.int64), stem[p],
                                                              full_resid[first_of[p]][stem[p]: len(p)],
                                                              prefix_kv=stem_kv.get(p[: stem[p]], none)) for p in rest])))
        kv: dict[tuple[int, ...], list[tuple[F32, F32]]] = {}
        for p in distinct:
            own, before = rest_kv.get(p), stem_kv[p[: stem[p]]] if stem[p] else None
            if before is None or own is None:
                kv[p] = before or own or none
            else:
                kv[p] = [(np.concatenate([bk, k]), np.concatenate([bv, v])) for (bk, bv), (k, v) in zip(before, own)]
        for c, prefix in zip(ctxs, prefixes):
            c.prefix_kv = kv.get(prefix, none)

    def _prefix_kv(self, parts: Sequence[TailContext]) -> list[list[tuple[F32, F32]]]:
        """Keys and values `(n, n_kv, d)` of each part's rows (`start..`, after its `prefix_kv`) at every
        layer above `first`, with nothing injected; all parts stacked in each matmul."""
        if not parts:
            return []
        cfg = self.cfg
        kv: list[list[tuple[F32, F32]]] = [[] for _ in parts]
        bounds = np.cumsum([0] + [p.n for p in parts])
        positions = np.concatenate([np.arange(p.start, len(p.ids)) for p in parts])
        x = np.concatenate([p.resid for p in parts]).astype(np.float32)  # (sum of rows, hidden)
        dl = self.layers[self.first]
        x = x + self._post_ffn(dl, self._mlp(dl, x, _Saved()))
        for slot, i in enumerate(range(self.first + 1, cfg.n_layers)):
            dl = self.layers[i]
            h, _, _ = _rms(x, dl.attn_norm, cfg.norm_eps)
            _, k, v, _ = self._qkv(i, dl, h, positions)  # (sum of rows, n_kv, d)
            for out, lo, hi in zip(kv, bounds[:-1], bounds[1:]):
                out.append((k[lo:hi].copy(), v[lo:hi].copy()))
            if i < cfg.n_layers - 1:  # the last layer's output feeds nothing here
                x = x + self._attention(i, dl, x, parts, slot, _Saved())
                x = x + self._post_ffn(dl, self._mlp(dl, x, _Saved()))
        return kv

    def _post_ffn(self, dl: DenseLayer, m: F32, sv: _Saved | None = None) -> F32:
        if dl.post_ffn_norm is None:
            return m
        y, n, inv = _rms(m, dl.post_ffn_norm, self.cfg.norm_eps)
        if sv is not None:
            sv.mlp["pn"], sv.mlp["pinv"] = n, inv
        return y

    def forward(self, ctxs: Sequence[TailContext], deltas: dict[int, F32],
                keep: I64 | None = None) -> tuple[F32, list[_Saved]]:
        """The final-normed residual `(N, hidden)` at every suffix row (contexts stacked in order),
        with `deltas[layer]` added to that layer's MLP output at each context's inject rows: `(hidden,)`
        for every context alike, or `(G, hidden)` with row `ctx.group` for each context.
        With `keep` (sorted stacked rows), the residual `(K, hidden)` at those rows alone: the last
        layer's attention output and MLP run there only, the rest feeds no later layer (the value
        step reads a third of the rows; gemma3-270m's MLP and output projection are 4/5 of a layer)."""
        cfg = self.cfg
        if keep is not None and (len(keep) == 0 or np.any(np.diff(keep) <= 0)):
            raise ValueError("Tail.forward: keep must be strictly increasing stacked rows")  # the backward scatters by assignment
        x = np.concatenate([c.resid for c in ctxs]).astype(np.float32)  # (N, hidden)
        offsets = np.cumsum([0] + [c.n for c in ctxs])[:-1]
        rows, row_group = _inject(ctxs, offsets)
        last = cfg.n_layers - 1
        saves = []
        for slot, i in enumerate(range(self.first, cfg.n_layers)):
            dl, sv = self.layers[i], _Saved()
            if i > self.first:
                sv.x_in = x
                narrow = keep if i == last and i not in deltas else None
                a = self._attention(i, dl, x, ctxs, slot - 1, sv, narrow)  # (N or K, hidden)
                x = (x if narrow is None else x[narrow]) + a
            m = self._first_mlp(dl, x, ctxs, offsets) if i == self.first else self._mlp(dl, x, sv)
            if i in deltas:  # m is this step's own array (both MLP paths return a new one), never saved
                m[rows] += deltas[i] if deltas[i].ndim == 1 else deltas[i][row_group]
            x = x + self._post_ffn(dl, m, sv)
            saves.append(sv)
        spread = keep is not None and len(x) != len(keep)  # the last layer ran every row (it has a delta)
        if spread:
            x = x[keep]
        y, n, inv = _rms(x, self.w.output_norm, cfg.norm_eps)
        saves.append(_Saved(mlp={"n": n, "inv": inv, "keep": keep if spread else None}))
        return y, saves

    def _first_mlp(self, dl: DenseLayer, x: F32, ctxs: Sequence[TailContext], offsets: I64) -> F32:
        """The first layer's MLP output at the stacked rows `x`: its input is the residual entering the
        tail, the same at every step, so each context's is computed once (the backward stops there)."""
        todo = [j for j, c in enumerate(ctxs) if c.first_mlp is None]
        if todo:
            m = self._mlp(dl, x[np.concatenate([np.arange(offsets[j], offsets[j] + ctxs[j].n) for j in todo])], _Saved())
            at = np.cumsum([0] + [ctxs[j].n for j in todo])
            for j, lo, hi in zip(todo, at[:-1], at[1:]):
                ctxs[j].first_mlp = m[lo:hi]
        return np.concatenate([c.first_mlp for c in ctxs])

    def backward(self, ctxs: Sequence[TailContext], deltas: dict[int, F32], saves: list[_Saved],
                 dy: F32) -> dict[int, F32]:
        """d loss / d deltas[layer] for every injected layer, from d loss / d (final-normed rows) `dy`:
        `(N, hidden)`, or `(K, hidden)` at the rows the forward pass kept."""
        cfg = self.cfg
        offsets = np.cumsum([0] + [c.n for c in ctxs])[:-1]
        rows, row_group = _inject(ctxs, offsets)
        fin = saves[-1].mlp
        dx = _rms_back(dy, self.w.output_norm, fin["n"], fin["inv"])  # type: ignore[arg-type]
        if fin["keep"] is not None:  # read at the kept rows of a last layer that ran every row
            full = np.zeros((sum(c.n for c in ctxs), dx.shape[1]), np.float32)
            full[fin["keep"]] = dx  # type: ignore[call-overload]
            dx = full
        grads: dict[int, F32] = {}
        for slot in range(cfg.n_layers - self.first - 1, -1, -1):
            i = self.first + slot
            dl, sv = self.layers[i], saves[slot]
            dm = dx
            if dl.post_ffn_norm is not None:
                dm = _rms_back(dx, dl.post_ffn_norm, sv.mlp["pn"], sv.mlp["pinv"])  # type: ignore[arg-type]
            if i in deltas:
                if deltas[i].ndim == 1:
                    grads[i] = dm[rows].sum(axis=0)
                else:  # each group's rows sum into its own gradient
                    g = np.zeros_like(deltas[i])
                    np.add.at(g, row_group, dm[rows])
                    grads[i] = g
            if i == self.first:
                break  # the residual entering the first MLP is a constant
            dx = dx + self._mlp_back(dl, dm, sv)
            keep = sv.attn["keep"]
            if keep is not None:  # the residual passed on at the kept rows alone
                full = np.zeros_like(sv.x_in)
                full[keep] = dx  # type: ignore[call-overload]
                dx = full + self._attention_back(dl, dx, sv)
            else:
                dx = dx + self._attention_back(dl, dx, sv)
        return grads
