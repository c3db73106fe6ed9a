"""The FFN block, once: gate / up projections, the gated activation, the down projection, with the
hook points `mlp.hook_pre`, `mlp.hook_post` and `hook_mlp_out`; edits plug in as a strategy.

An edit strategy (`FFNEdits`) changes the block per layer, without model/ knowing where the edits
come from (the vindex's patch overlay, a ROME/MEMIT weight edit, a test):
- feature overrides: a feature's gate row, up row or down column replaced;
- deletions: a feature's activation zeroed (it writes nothing);
- a low-rank down delta: W_down' = W_down + U V^T, applied as (act V) U^T without forming W_down';
- top_k: each position keeps only its k features of largest |gate score| (the vindex's gate KNN);
- added features: whole (gate, up, down) features appended to the layer, run after the base ones —
  the layer computes what an FFN that many features wider would. The hook points keep the base
  width (a hook sees the model's own features) and top_k ranks base features only.
With no strategy the block is the dense FFN, operation for operation.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelError, UnsupportedError
from larql.model import prefill_ops
from larql.model.config import ModelConfig
from larql.model.hooks import HookFns, expert_hook_names, layer_hook_names, run_hook
from larql.model.weights import Weights

F32 = NDArray[np.float32]
# a feature's replacement vectors, each `(hidden,)` float32, None keeps the stored one
FeatureVectors = tuple["F32 | None", "F32 | None", "F32 | None"]  # (gate row, up row, down column)

_GELU_C = np.float32(np.sqrt(2.0 / np.pi))


# float32 in, float32 out. In place on one or two temporaries rather than a new array per operation
# (a prefill's (256, 2048) gate scores: 2 MB each); the same operations in the same order as
# 0.5 * x * (1 + tanh(C * (x + 0.044715 * x * x * x))) and x / (1 + exp(-x)), so the same bits (test).
def gelu_tanh(x: F32) -> F32:
    t = np.multiply(np.float32(0.044715), x)
    t *= x
    t *= x
    t += x
    t *= _GELU_C
    np.tanh(t, out=t)
    t += np.float32(1.0)
    out = np.multiply(np.float32(0.5), x)
    out *= t
    return cast(F32, out)


def silu(x: F32) -> F32:
    t = np.negative(x)
    with np.errstate(over="ignore"):  # exp(-x) = inf far below 0 (an inserted gate): x / inf = 0, as it should be
        np.exp(t, out=t)
    t += np.float32(1.0)
    return cast(F32, np.divide(x, t, out=t))


def gated(activation: str, gate: F32, up: F32 | None) -> F32:
    """act(gate) * up for activation "gelu_tanh" or "silu", `(T, ffn)` in and out; act(gate) when
    the MLP has no up projection (GPT-2). numpy's tanh/exp (vectorized; numba's call libm per element)
    between two numba passes for the polynomial parts (prefill_ops.gated_mul: the same bits, half the
    time of numpy's whole-array steps); numpy's steps for other inputs."""
    if (up is not None and activation in ("gelu_tanh", "silu") and gate.dtype == up.dtype == np.float32
            and gate.shape == up.shape and gate.flags.c_contiguous and up.flags.c_contiguous):
        return prefill_ops.gated_mul(activation, gate, up)  # (T, ffn)
    act = gelu_tanh(gate) if activation == "gelu_tanh" else silu(gate)
    if up is not None:
        act *= up
    return act


class FFNEdits(Protocol):
    """What an edit strategy tells the FFN, per layer. Every method is called once per layer and
    forward step, so an unedited layer should answer from a dict lookup."""

    top_k: int | None  # None, or keep each position's k features of largest |gate score|

    def feature_overrides(self, layer: int) -> Mapping[int, FeatureVectors]:
        """feature -> (gate row, up row, down column), None for a part left as stored."""
        ...

    def deleted(self, layer: int) -> AbstractSet[int]:
        """Features whose activation is zeroed."""
        ...

    def down_delta(self, layer: int) -> tuple[F32, F32] | None:
        """(U `(hidden, r)`, V `(ffn, r)`) float32: W_down' = W_down + U @ V.T; None for no delta."""
        ...

    def added(self, layer: int) -> tuple[F32, F32, F32] | None:
        """Features appended to the layer: gate `(n, hidden)`, up `(n, hidden)`, down `(hidden, n)`
        float32; None for none."""
        ...


@dataclass(frozen=True)
class ExpertHooks:
    """What the per-expert hook points of one MoE layer call need: the hooks, the hooked experts,
    each called expert's routed positions (in `expert_outputs`' order), the positions T, the start."""

    hooks: HookFns
    experts: AbstractSet[int]
    rows: list[NDArray[np.intp]]
    t: int
    start: int


class FFN:
    """The FFN of every layer of one model, called by the forward pass on the normed residual."""

    def __init__(self, cfg: ModelConfig, weights: Weights, edits: FFNEdits | None = None) -> None:
        self.activation, self.weights, self.edits = cfg.activation, weights, edits
        self.n_used = cfg.n_experts_used
        self.names = layer_hook_names(cfg.n_layers)
        self.expert_names = tuple(expert_hook_names(i, cfg.n_experts) for i in range(cfg.n_layers))
        # dequantized W_down `(hidden, ffn)` of layers where a down column was overridden: the base
        # weights never change, so one copy per layer serves every later edit
        self._downs: dict[int, F32] = {}
        self._expert_downs: dict[tuple[int, int], F32] = {}  # the same per (layer, expert)

    def __call__(self, i: int, h: F32, hooks: HookFns | None, start: int) -> F32:
        """FFN output `(T, hidden)` of layer i for its normed input h `(T, hidden)`."""
        lw, n, edits = self.weights.layers[i], self.names[i], self.edits
        if lw.router is not None:
            return self._experts(i, h, hooks, start)
        overrides = edits.feature_overrides(i) if edits is not None else {}
        assert lw.gate is not None and lw.down is not None  # a dense layer (None only with a router)
        gate = lw.gate.matmul(h)  # (T, ffn) every feature's gate score: its gate row . h
        if lw.gate_bias is not None:
            gate += lw.gate_bias
        for f, (g, _, _) in overrides.items():
            if g is not None:
                gate[:, f] = h @ g
        if hooks:
            gate = run_hook(hooks, n.mlp_pre, gate, start)
        up = lw.up.matmul(h) if lw.up is not None else None  # (T, ffn); None: no gate (GPT-2)
        if up is not None and lw.up_bias is not None:
            up += lw.up_bias
        for f, (_, u, _) in overrides.items():
            if u is not None:
                if up is None:
                    raise UnsupportedError(f"layer {i}: this MLP has no up projection; an edit cannot set "
                                           f"feature {f}'s up row")
                up[:, f] = h @ u
        act = gated(self.activation, gate, up)  # (T, ffn) act(gate) * up
        if edits is not None:
            act = self._select(i, edits, gate, act)
        if hooks:
            act = run_hook(hooks, n.mlp_post, act, start)
        out = lw.down.matmul(act)  # (T, hidden)
        if lw.down_bias is not None:
            out += lw.down_bias
        if edits is not None:
            out = self._edit_down(i, edits, overrides, act, out)
            more = edits.added(i)
            if more is not None:
                g_add, u_add, d_add = more  # (n, hidden), (n, hidden), (hidden, n)
                out += gated(self.activation, h @ g_add.T, h @ u_add.T if up is not None else None) @ d_add.T  # (T, hidden)
        if hooks:
            out = run_hook(hooks, n.mlp_out, out, start)
        return out

    def _experts(self, i: int, h: F32, hooks: HookFns | None, start: int) -> F32:
        """A mixture of experts (Mixtral), as transformers runs it: softmax of the router logits,
        each position's top-k experts, their probabilities renormalised to sum to 1, the weighted
        sum of those experts' gated FFNs. mlp.hook_pre / hook_post have no single FFN here; each
        expert has its own (mlp.experts.E.hook_pre / hook_post / hook_out, see `_expert_hook`).
        Edits name expert e's feature j as feature e x ffn + j (the vindex's numbering); an edited
        feature acts only where the router picks its expert."""
        lw, n, edits = self.weights.layers[i], self.names[i], self.edits
        if edits is not None and (edits.top_k is not None or edits.down_delta(i) is not None
                                  or edits.added(i) is not None):
            raise UnsupportedError(f"layer {i}: a walk top-k, weight edits (ROME/MEMIT) and added features (NEURON) "
                                   f"address one dense FFN; this layer is a mixture of experts (feature edits and "
                                   f"deletions work)")
        assert lw.router is not None  # called only for a layer with a router
        logits = lw.router.matmul(h)  # (T, n_experts)
        if hooks:
            logits = run_hook(hooks, n.router, logits, start)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)  # (T, n_experts)
        if hooks:
            probs = run_hook(hooks, n.expert_weights, probs, start)
        chosen = np.argsort(-probs, axis=1, kind="stable")[:, : self.n_used]  # (T, k) as torch.topk
        if hooks:
            chosen = self._chosen_hook(hooks, n.expert_indices, chosen, start, len(lw.experts))
        weight = np.take_along_axis(probs, chosen, axis=1)
        weight /= weight.sum(axis=1, keepdims=True)  # (T, k)
        out = np.zeros_like(h)  # (T, hidden)
        # a hooked expert runs even where no position is routed to it, so that its points are reached
        hooked = {e for e, names in enumerate(self.expert_names[i]) if any(nm in hooks for nm in names)} if hooks else set()
        experts = sorted({int(e) for e in np.unique(chosen)} | hooked)
        picks = [np.nonzero(chosen == e) for e in experts]  # positions routed to each expert, and in which slot
        ys = self.expert_outputs(i, experts, [np.ascontiguousarray(h[rows]) for rows, _ in picks],
                                 ExpertHooks(hooks, hooked, [rows for rows, _ in picks], len(h), start) if hooks and hooked else None)
        for (rows, slot), y in zip(picks, ys):
            out[rows] += y * weight[rows, slot][:, None]
        if hooks:
            out = run_hook(hooks, n.mlp_out, out, start)
        return out

    def expert_outputs(self, i: int, experts: list[int], xs: list[F32],
                       hooked: ExpertHooks | None = None) -> list[F32]:
        """Each expert's gated FFN `(t_e, hidden)` on the rows routed to it `xs[e]` `(t_e, hidden)`,
        before the router's weighting, with the feature edits and deletions (and the per-expert hook
        points of the experts in `hooked`): the part of a layer of experts an expert shard computes
        (larql/serve/expert_remote.py)."""
        lw, edits = self.weights.layers[i], self.edits
        overrides: Mapping[int, FeatureVectors] = {}
        gone: AbstractSet[int] = frozenset()
        if edits is not None:
            overrides, gone = edits.feature_overrides(i), edits.deleted(i)
        ys = []
        for k, (e, x) in enumerate(zip(experts, xs)):
            gate, up, down = lw.experts[e]
            if len(x):
                g, u = gate.matmul(x), up.matmul(x)  # (t_e, ffn)
            else:  # a hooked expert no position uses
                g = u = np.zeros((0, gate.n_rows), dtype=np.float32)
            names = self.expert_names[i][e] if hooked is not None and e in hooked.experts else None
            first = int(e) * gate.n_rows  # expert e's features in the edits' numbering
            mine = {f - first: vec for f, vec in overrides.items() if first <= f < first + gate.n_rows}
            for j, (gv, uv, _) in mine.items():
                if gv is not None:
                    g[:, j] = x @ gv
                if uv is not None:
                    u[:, j] = x @ uv
            if names:
                g = self._expert_hook(hooked, names[0], g, k)
            act = gated(self.activation, g, u)
            silenced = [f - first for f in gone if first <= f < first + gate.n_rows]
            if silenced:
                act[:, silenced] = 0.0
            if names:
                act = self._expert_hook(hooked, names[1], act, k)
            y = down.matmul(act) if len(x) else np.zeros((0, down.n_rows), np.float32)  # (t_e, hidden)
            downs = [(j, dv) for j, (_, _, dv) in mine.items() if dv is not None]
            if downs:
                if (i, int(e)) not in self._expert_downs:
                    self._expert_downs[(i, int(e))] = down.dequantize()  # (hidden, ffn), once, as _downs
                stored = self._expert_downs[(i, int(e))]
                for j, dv in downs:
                    y += np.outer(act[:, j], dv - stored[:, j])  # swap the feature's column
            if names:
                y = self._expert_hook(hooked, names[2], y, k)
            ys.append(y)
        return ys

    @staticmethod
    def _chosen_hook(hooks: HookFns, name: str, chosen: NDArray[np.intp], start: int, n_experts: int
                     ) -> NDArray[np.intp]:
        """The chosen experts `(T, k)` through the hook at `name`: what it returns (the same shape)
        is routed to, so it must name experts 0..n_experts-1, each once per position."""
        if name not in hooks:
            return chosen
        out = np.asarray(run_hook(hooks, name, chosen.astype(np.int64), start))
        if (out.shape != chosen.shape or not np.array_equal(out, np.round(out)) or out.min() < 0
                or out.max() >= n_experts or any(len(set(row)) != len(row) for row in out.tolist())):
            raise ModelError(f"hook {name}: the chosen experts must be a {list(chosen.shape)} array of distinct "
                             f"expert numbers 0..{n_experts - 1} per position")
        return out.astype(np.intp)

    @staticmethod
    def _expert_hook(hooked: ExpertHooks | None, name: str, part: F32, k: int) -> F32:
        """The k-th expert's activation of its routed rows `(t_e, n)` through the hook at `name`, seen
        as `(T, n)` (zero where the router did not pick the expert), so that the hook's positions are
        the sequence's as at every other point; only the routed rows are read back."""
        assert hooked is not None  # called only for a hooked expert
        rows = hooked.rows[k]
        full = np.zeros((hooked.t, part.shape[1]), dtype=np.float32)  # (T, n)
        full[rows] = part
        return np.ascontiguousarray(run_hook(hooked.hooks, name, full, hooked.start)[rows])

    @staticmethod
    def _select(i: int, edits: FFNEdits, gate: F32, act: F32) -> F32:
        gone = edits.deleted(i)
        if gone:
            act[:, sorted(gone)] = 0.0  # deleted features write nothing
        k = edits.top_k
        if k is not None and k < act.shape[1]:
            # the gate KNN: keep each position's k features of largest |gate score|
            drop = np.argpartition(-np.abs(gate), k, axis=1)[:, k:]  # (T, ffn - k)
            np.put_along_axis(act, drop, 0.0, axis=1)
        return act

    def _edit_down(self, i: int, edits: FFNEdits, overrides: Mapping[int, FeatureVectors], act: F32,
                   out: F32) -> F32:
        downs = [(f, d) for f, (_, _, d) in overrides.items() if d is not None]
        if downs:
            if i not in self._downs:
                down_matrix = self.weights.layers[i].down
                assert down_matrix is not None  # overrides: a dense layer (FFN edits refuse experts)
                self._downs[i] = down_matrix.dense()  # (hidden, ffn), the weights' kept copy (read-only)
            stored = self._downs[i]
            for f, down in downs:
                out += np.outer(act[:, f], down - stored[:, f])  # swap the feature's column
        delta = edits.down_delta(i)
        if delta is not None:
            u, v = delta  # (hidden, r), (ffn, r)
            out += (act @ v) @ u.T  # (T, hidden): act (W_down + U V^T)^T without the dense update
        return out
