"""Hook points (TransformerLens names), typed names, interventions and the activation cache.

Per layer L, in forward order:
    blocks.L.hook_resid_pre      (T, hidden)       residual entering the layer
    blocks.L.attn.hook_q/k/v     (T, heads, d)     the projections (+ bias), before q/k norm and RoPE,
                                                   as TransformerLens's (k, v: kv heads)
    blocks.L.attn.hook_rot_q/k   (T, heads, d)     q and k as attention uses them: after q/k norm and
                                                   RoPE (TransformerLens's names; never reached in
                                                   a model with learned positions)
    blocks.L.attn.hook_scores    (T, heads, S)     pre-softmax scores over the S keys so far
    blocks.L.attn.hook_pattern   (T, heads, S)     softmax of the scores
    blocks.L.hook_attn_out       (T, hidden)       after o_proj, before Gemma's post-attention norm
    blocks.L.hook_resid_mid      (T, hidden)
    blocks.L.mlp.hook_router     (T, experts)      a mixture of experts' router logits (Mixtral only)
    blocks.L.mlp.hook_expert_weights  (T, experts) their softmax, before the top-k (TransformerLens's)
    blocks.L.mlp.hook_expert_indices  (T, k)       the experts chosen, int64, largest weight first
    blocks.L.mlp.experts.E.hook_pre   (T, ffn)     expert E's gate projection   } TransformerLens's MoE
    blocks.L.mlp.experts.E.hook_post  (T, ffn)     act(gate) * up of expert E   } names; rows the router
    blocks.L.mlp.experts.E.hook_out   (T, hidden)  expert E's down projection,  } did not send to E are
                                                   before the router's weight   } zero and ignored
    blocks.L.mlp.hook_pre        (T, ffn)          gate projection (+ bias); GPT-2: the fc projection
    blocks.L.mlp.hook_post       (T, ffn)          activation(gate) * up; GPT-2: activation(fc)
    blocks.L.hook_mlp_out        (T, hidden)       after down_proj, before Gemma's post-FFN norm
    blocks.L.hook_resid_post     (T, hidden)
around the layers: hook_embed (T, hidden; after Gemma's sqrt(hidden) scale), hook_final_norm.
T counts the positions being computed (all of them in a forward pass, one per decode step);
interventions address absolute token positions, so they mean the same through a KV cache.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelError

__all__ = ["Add", "HookName", "HookSpec", "Intervention", "Knockout", "LayerHookNames", "Replace", "Scale", "TopK", "Zero", "all_hook_names", "expert_hook_names", "hook_name", "intervention_fn", "layer_hook_names", "sparse_ffn"]

F32 = NDArray[np.float32]

LAYER_KINDS = ("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_rot_q", "attn.hook_rot_k",
               "attn.hook_scores", "attn.hook_pattern", "hook_attn_out", "hook_resid_mid", "mlp.hook_router",
               "mlp.hook_expert_weights", "mlp.hook_expert_indices",
               "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out", "hook_resid_post")
GLOBAL_HOOKS = ("hook_embed", "hook_final_norm")
EXPERT_KINDS = ("hook_pre", "hook_post", "hook_out")  # per expert: blocks.L.mlp.experts.E.<kind>


class LayerHookNames(NamedTuple):
    resid_pre: str
    q: str
    k: str
    v: str
    rot_q: str
    rot_k: str
    scores: str
    pattern: str
    attn_out: str
    resid_mid: str
    router: str
    expert_weights: str
    expert_indices: str
    mlp_pre: str
    mlp_post: str
    mlp_out: str
    resid_post: str


def layer_hook_names(n_layers: int) -> tuple[LayerHookNames, ...]:
    """Names built once per model, so the forward pass never formats strings."""
    return tuple(LayerHookNames(*(f"blocks.{i}.{k}" for k in LAYER_KINDS)) for i in range(n_layers))


def expert_hook_names(layer: int, n_experts: int) -> tuple[tuple[str, str, str], ...]:
    """Per expert of one layer: the names of its hook_pre, hook_post and hook_out."""
    return tuple(tuple(f"blocks.{layer}.mlp.experts.{e}.{k}" for k in EXPERT_KINDS)  # type: ignore[misc]
                 for e in range(n_experts))


def all_hook_names(n_layers: int, unreached: tuple[str, ...] = (), n_experts: int = 0) -> list[str]:
    """Every hook point in forward order, less the kinds in `unreached` (see Model.hook_names); with
    experts, each one's points follow the routing's, expert by expert."""
    names = [GLOBAL_HOOKS[0]]
    for i in range(n_layers):
        for kind in LAYER_KINDS:
            if kind not in unreached:
                names.append(f"blocks.{i}.{kind}")
            if kind == "mlp.hook_expert_indices" and n_experts:
                names += [n for per in expert_hook_names(i, n_experts) for n in per]
    return [*names, GLOBAL_HOOKS[1]]


@dataclass(frozen=True)
class HookName:
    """A validated hook point: `layer` is None for hook_embed / hook_final_norm."""

    layer: int | None
    kind: str

    def __str__(self) -> str:
        return self.kind if self.layer is None else f"blocks.{self.layer}.{self.kind}"


def hook_name(name: str | HookName, n_layers: int, n_experts: int = 0) -> HookName:
    """Parse and check a hook name; an unknown one is an error naming the nearest valid names."""
    if isinstance(name, HookName):
        name = str(name)
    if name in GLOBAL_HOOKS:
        return HookName(None, name)
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() and (
            parts[2] in LAYER_KINDS or _expert_kind(name, parts[2], n_experts)):
        layer = int(parts[1])
        if layer >= n_layers:
            raise ModelError(f"hook {name!r}: layer {layer} is out of range (this model has layers 0-{n_layers - 1})")
        return HookName(layer, parts[2])
    near = difflib.get_close_matches(name, all_hook_names(n_layers, (), n_experts), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else "; valid names look like blocks.0.hook_resid_post"
    raise ModelError(f"unknown hook point {name!r}{hint}")


def _expert_kind(name: str, kind: str, n_experts: int) -> bool:
    """Whether `kind` is mlp.experts.E.hook_* (an error if E is not one of this model's experts)."""
    parts = kind.split(".")
    if len(parts) != 4 or parts[:2] != ["mlp", "experts"] or not parts[2].isdigit() or parts[3] not in EXPERT_KINDS:
        return False
    if int(parts[2]) >= n_experts:
        have = f"experts 0-{n_experts - 1}" if n_experts else "no experts"
        raise ModelError(f"hook {name!r}: expert {parts[2]} is out of range (this model has {have})")
    return True


# ---- interventions ------------------------------------------------------------------------------

Positions = int | tuple[int, ...] | list[int] | None  # absolute token positions; None = all


@dataclass(frozen=True)
class Replace:
    value: F32  # broadcastable to the activation of one position (or of all selected positions)
    positions: Positions = None


@dataclass(frozen=True)
class Add:
    value: F32  # e.g. a steering vector (hidden,)
    positions: Positions = None


@dataclass(frozen=True)
class Scale:
    factor: float
    positions: Positions = None


@dataclass(frozen=True)
class Zero:
    positions: Positions = None


@dataclass(frozen=True)
class Knockout:
    """Remove attention edges before the softmax (for attn.hook_scores): head, query and key
    positions (None = all)."""

    heads: Positions = None
    queries: Positions = None
    keys: Positions = None


@dataclass(frozen=True)
class TopK:
    """Keep, at every position, only the k entries of largest magnitude (on mlp.hook_post: a sparse
    FFN that uses the k features that fired hardest)."""

    k: int


def sparse_ffn(n_layers: int, k: int) -> dict[str, TopK]:
    """A hook spec running every layer's FFN with only its top-k features."""
    return {f"blocks.{i}.mlp.hook_post": TopK(k) for i in range(n_layers)}


Intervention = Replace | Add | Scale | Zero | Knockout | TopK | Callable[[F32, str], "F32 | None"]
HookSpec = Mapping[str | HookName, Intervention | list]
# the forward pass's internal form: name -> fn(x, name, start) returning a replacement or None
HookFns = Mapping[str, Callable[[F32, str, int], "F32 | None"]]


def run_hook(hooks: HookFns, name: str, x: F32, start: int) -> F32:
    """x through the hook at `name`, if any: its return value replaces x unless it is None."""
    fn = hooks.get(name)
    if fn is None:
        return x
    out = fn(x, name, start)
    return x if out is None else out


def _rows(positions: Positions, start: int, t: int) -> NDArray[np.int64] | slice:
    """Indices into the T computed positions (absolute start..start+T-1) that `positions` selects."""
    if positions is None:
        return slice(None)
    wanted = np.atleast_1d(np.asarray(positions, dtype=np.int64))
    rel = wanted - start
    return rel[(rel >= 0) & (rel < t)]


def _check_value(name: str, x: F32, value: F32) -> F32:
    v = np.asarray(value, dtype=np.float32)
    if v.shape != x.shape[1:] and v.shape != x.shape:
        raise ModelError(f"hook {name}: value of shape {list(v.shape)} does not fit an activation of shape "
                         f"{list(x.shape)} (give {list(x.shape[1:])} for one position)")
    return v


def _apply(iv: Intervention, x: F32, name: str, start: int) -> F32 | None:
    if callable(iv) and not isinstance(iv, (Replace, Add, Scale, Zero, Knockout, TopK)):
        return iv(x, name)
    if isinstance(iv, TopK):
        if iv.k >= x.shape[-1]:
            return None
        if iv.k < 1:
            raise ModelError(f"TopK needs k >= 1, got {iv.k}")
        flat = x.reshape(-1, x.shape[-1])
        drop = np.argpartition(-np.abs(flat), iv.k, axis=1)[:, iv.k:]  # all but the k largest |x|
        out = flat.copy()
        np.put_along_axis(out, drop, 0.0, axis=1)
        return out.reshape(x.shape)
    if isinstance(iv, Knockout):
        if not name.endswith("attn.hook_scores"):
            raise ModelError(f"Knockout applies to attn.hook_scores, not {name}")
        t, h, k = x.shape
        q_mask, h_mask, k_mask = np.zeros(t, bool), np.zeros(h, bool), np.zeros(k, bool)
        q_mask[_rows(iv.queries, start, t)] = True
        h_mask[slice(None) if iv.heads is None else np.atleast_1d(iv.heads)] = True
        k_mask[slice(None) if iv.keys is None else np.atleast_1d(iv.keys)] = True
        mask = q_mask[:, None, None] & h_mask[None, :, None] & k_mask[None, None, :]  # (T, H, S)
        return np.where(mask, np.float32(-np.inf), x)
    rows = _rows(iv.positions, start, x.shape[0])
    out = x.copy()
    if isinstance(iv, Replace):
        value = _check_value(name, x, iv.value)
        out[rows] = value if value.shape == x.shape[1:] else value[rows]
    elif isinstance(iv, Add):
        value = _check_value(name, x, iv.value)
        out[rows] += value if value.shape == x.shape[1:] else value[rows]
    elif isinstance(iv, Scale):
        out[rows] *= np.float32(iv.factor)
    elif isinstance(iv, Zero):
        out[rows] = 0.0
    return out


def compile_spec(spec: HookSpec | None, n_layers: int,
                 n_experts: int = 0) -> dict[str, Callable[[F32, str, int], F32 | None]] | None:
    """A user HookSpec (names -> interventions, lists of them, or callbacks) -> forward-pass hook fns."""
    if not spec:
        return None
    return {str(hook_name(key, n_layers, n_experts)): intervention_fn(value) for key, value in spec.items()}


def intervention_fn(value: Intervention | list) -> Callable[[F32, str, int], F32]:
    """One spec entry (an intervention, a callback, or a list of them applied in order) as a
    forward-pass hook fn(x, name, start)."""
    chain = list(value) if isinstance(value, list) else [value]

    def fn(x: F32, hook: str, start: int) -> F32:
        for iv in chain:
            out = _apply(iv, x, hook, start)
            if out is not None:
                if out.shape != x.shape:
                    raise ModelError(f"hook {hook}: a callback returned shape {list(out.shape)}, "
                                     f"expected {list(x.shape)}")
                x = out
        return x

    return fn


def capture_into(cache: dict[str, list[F32]], names: list[str], fns: dict[str, Any] | None) -> dict[str, Any]:
    """Add capturing hooks for `names` (after any intervention at the same point) to `fns`."""
    out = dict(fns or {})
    for name in names:
        inner = out.get(name)

        def fn(x: F32, hook: str, start: int, inner: Any = inner) -> F32:
            if inner is not None:
                x = inner(x, hook, start)
            cache.setdefault(hook, []).append(np.array(x, copy=True))
            return x

        out[name] = fn
    return out
