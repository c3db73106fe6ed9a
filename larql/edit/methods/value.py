"""The value step of ROME/MEMIT: what a layer's MLP should output at the subject's last token.

For a group of facts about one subject, find vectors delta[L] (one per edited layer) added to those
layers' MLP outputs (before Gemma's post-FFN norm) at the subject's last token, such that:
- every target token wins, teacher-forced, on the fact's prompts — each bare and behind the
  model-written prefixes of `facts.model_prefixes` — (mean NLL of the whole target, not its first
  token), and
- what the model says about the subject otherwise (KL_PROMPTS, "{subject} is a"...) moves little (KL),
- delta stays small (weight decay relative to the MLP output's norm; a hard clamp at CLAMP times it).
Optimised with Adam through `model.grad.Tail` (an exact hand-written backward pass), stopping two
steps after every target token is the top-1 on every optimised prompt (ENCORE's MPES) or at
`max_steps` (the last of those steps is not run forward again only to be seen). The keys (the down
projection's inputs at the same token, averaged over the same prompts) come out of the same
forward passes.

The loss reads logits over candidate tokens only (the targets and the tokens that were likely at
the scored positions, refreshed from the full vocabulary every REFRESH steps), which keeps the
262k-token unembedding out of the inner loop; the caller checks the edit with the real model.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
from numpy.typing import NDArray

from larql.edit.methods.capture import capture_stemmed
from larql.edit.methods.facts import Fact, rewrites
from larql.errors import EditError
from larql.model.forward import norm
from larql.model.grad import DenseLayer, Tail, TailContext
from larql.model.model import Model
from larql.model.targets import subject_position, target_ids
from larql.quant.tensor import QuantMatrix

F32 = NDArray[np.float32]
KL_WEIGHT = 0.0625  # ROME's, per prompt below
# The subject's other relations (relations.relation_holds) are held harder than ROME's prompts, and a
# value is not done while one has lost its top-1 (for up to HOLD_STEPS steps): the weight that kept them
# on the development edits with the edits still winning (docs/design/edit-defaults.md)
RELATION_KL_WEIGHT = 0.5
# ROME keeps "{subject} is a" close to the unedited distribution; the other two guard the subject's
# other facts, which share its key (without them "People in France speak" lost French)
KL_PROMPTS = ("{} is a", "{} is known for", "In {}, people")
# A subject the model says nothing about (DESCRIBE's probes answer nothing) has no other facts to
# guard, so it keeps ROME's prompt alone: fewer tail rows a subject, and the same scores
UNKNOWN_KL_PROMPTS = KL_PROMPTS[:1]
# Weight decay on ||delta||^2 / ||mlp out||^2 and a hard clamp on ||delta|| / ||mlp out||; ROME's are 0.5 and 4.
# The edit disturbs every other token's MLP output in proportion to ||delta||, so larql asks for the
# smallest delta that still wins: tighter bounds than ROME's keep more of the neighbours and of the
# unrelated prompts' top-1s (docs/design/edit-defaults.md has the measurements)
WEIGHT_DECAY = 2.0
CLAMP = 2.0
# A subject whose target does not win within those bounds is optimised again with ROME's.
ROME_WEIGHT_DECAY, ROME_CLAMP = 0.5, 4.0
# Models that need ROME's bounds from the start: SmolLM2-135M's layer-4 values reach the top-1 in
# the tail within the small bounds but then fall short on the real prompts
VALUE_BOUNDS = {"smollm2-135m": (ROME_WEIGHT_DECAY, ROME_CLAMP)}


def value_bounds(model_name: str) -> tuple[float, float]:
    """(weight decay, clamp) of the value step for a model."""
    return VALUE_BOUNDS.get(model_name, (WEIGHT_DECAY, CLAMP))
LR = 0.5  # Adam step per coordinate, in units of the MLP output's rms at the subject
MAX_STEPS = 25
HOLD_STEPS = 12
EXTRA_STEPS = 2  # MPES: keep going this many steps after every target token is top-1
CANDIDATES = 256  # per scored position, from the full vocabulary
REFRESH = 6


@dataclass(frozen=True)
class ValueResult:
    deltas: dict[int, F32]  # layer -> (hidden,)
    keys: dict[int, F32]  # layer -> (ffn,) mean down-projection input at the subject's last token
    steps: int
    nll_before: float  # mean per-token NLL of the targets over the optimised prompts (tail's view)
    nll_after: float
    top1: bool  # every target token the top-1 on every optimised prompt, at the last forward pass
    n_prompts: int
    inputs: dict[int, F32] = field(default_factory=dict)  # layer -> (hidden,) mean normalised MLP input there


@dataclass
class _Scored:
    ctx: int  # index into contexts
    rows: NDArray[np.int64]  # rows of that context's suffix whose next token is scored
    tokens: NDArray[np.int64]  # the target tokens there (empty for the KL prompt)
    kl: bool = False
    weight: float = 1.0  # of this KL prompt's term, in units of the KL weight
    keep: bool = False  # a relation hold: its top-1 must stay for the value to be done


def _capture(model: Model, batch: list[list[int]], layers: Sequence[int]) -> list[dict[str, F32]]:
    """resid_mid, the down-projection input and the MLP output at `layers`, per prompt, in packed passes
    (the prefix and template words every subject's prompts share run once)."""
    names = [f"blocks.{layer}.{kind}" for layer in layers for kind in ("hook_resid_mid", "mlp.hook_post", "hook_mlp_out")]
    return capture_stemmed(model, batch, names)


@dataclass
class _Group:
    """One subject's optimisation inside a batch: its contexts, scored rows and Adam state."""

    subject: str
    contexts: list[TailContext]
    scored: list[_Scored]
    n_prompts: int
    keys: dict[int, F32]
    mlp_norm: float
    all_rows: NDArray[np.int64]  # scored rows within this group's stacked suffix rows
    n_rows: int  # this group's stacked suffix rows
    inputs: dict[int, F32] = field(default_factory=dict)
    deltas: dict[int, F32] = field(default_factory=dict)
    m1: dict[int, NDArray[np.float64]] = field(default_factory=dict)
    m2: dict[int, NDArray[np.float64]] = field(default_factory=dict)
    y_ref: F32 | None = None  # (n_kl, hidden) the KL prompts' final-normed rows before the edit
    cand: NDArray[np.int64] | None = None
    e_c: F32 | None = None
    ref_p: NDArray[np.float64] | None = None
    nll_before: float = float("inf")
    nll: float = float("inf")
    top1: bool = False
    kept: bool = True  # every relation hold's top-1 as before
    extra: int = 0
    steps: int = 0
    done: bool = False


@dataclass(frozen=True)
class _Prompts:
    """A subject's optimised prompts (each fact's prompt and user prompts, bare and behind each
    prefix, the target's tokens following) and then its KL prompts, as token ids."""

    subject: str
    ctx_ids: list[list[int]]
    starts: list[int]  # the subject's last token in each
    scored: list[_Scored]
    n_prompts: int


def _group_prompts(model: Model, facts: Sequence[Fact], prefixes: Sequence[str],
                   kl_prompts: Sequence[str] = KL_PROMPTS, holds: Sequence[str] = (), at_last: bool = False) -> _Prompts:
    subject, key = facts[0].subject, facts[0].keyed
    if any(f.subject != subject or f.keyed != key for f in facts):
        raise EditError("optimise_value takes facts about one subject; group them first")
    ctx_ids: list[list[int]] = []
    starts: list[int] = []
    scored: list[_Scored] = []
    for fact in facts:
        tids = target_ids(model, fact.target)
        turned = [t for t in rewrites(fact.prompt, subject) if t not in fact.prompts]
        for base in (fact.prompt, *fact.prompts, *turned):
            for prefix in ("", *prefixes):
                ids, s = subject_position(model, prefix + base, subject, key)
                n_prompt = len(ids)
                s = n_prompt - 1 if at_last else s
                ids = ids + tids[:-1]  # teacher forcing: the target's tokens follow the prompt
                scored.append(_Scored(len(ctx_ids), np.arange(n_prompt - 1, n_prompt - 1 + len(tids)) - s,
                                      np.asarray(tids, np.int64)))
                ctx_ids.append(ids)
                starts.append(s)
    n_prompts = len(ctx_ids)
    for template in kl_prompts:  # what the model says about the subject otherwise should stay
        kl_ids, kl_s = subject_position(model, template.format(subject), subject, key)
        scored.append(_Scored(len(ctx_ids), np.array([len(kl_ids) - 1 - kl_s]), np.zeros(0, np.int64), kl=True))
        ctx_ids.append(kl_ids)
        starts.append(kl_s)
    for text in holds:  # the subject's other relations: their answers should not move at all
        kl_ids, kl_s = subject_position(model, text, subject, key)
        scored.append(_Scored(len(ctx_ids), np.array([len(kl_ids) - 1 - kl_s]), np.zeros(0, np.int64), kl=True,
                              weight=RELATION_KL_WEIGHT / KL_WEIGHT, keep=True))
        ctx_ids.append(kl_ids)
        starts.append(kl_s)
    if max(len(i) for i in ctx_ids) > model.config.context_length:
        raise EditError("a prompt with its target is longer than the model's context")
    return _Prompts(subject, ctx_ids, starts, scored, n_prompts)


def _build_groups(model: Model, groups: Sequence[Sequence[Fact]], layers: Sequence[int],
                  prefixes: Sequence[str], unknown: Collection[str] = (),
                  holds: Mapping[str, Sequence[str]] | None = None, at_last: bool = False,
                  ) -> list[tuple[_Group, list[F32]]]:
    """Every subject's prompts run through the real model in packed passes: per subject, the
    residual entering the first layer's MLP at every position, and the keys. `at_last`: the value
    is added at each prompt's last token (a neuron keyed on the query), and nothing else is held."""
    prompts = [_group_prompts(model, facts, prefixes,
                              () if at_last else UNKNOWN_KL_PROMPTS if facts[0].subject in unknown else KL_PROMPTS,
                              () if at_last else (holds or {}).get(facts[0].subject, ()), at_last) for facts in groups]
    got = iter(_capture(model, [ids for p in prompts for ids in p.ctx_ids], layers))
    return [_build_group(model, p, [next(got) for _ in p.ctx_ids], layers) for p in prompts]


def _build_group(model: Model, prompts: _Prompts, captured: Sequence[dict[str, F32]],
                 layers: Sequence[int]) -> tuple[_Group, list[F32]]:
    first, cfg = layers[0], model.config
    ctx_ids, starts, scored, n_prompts = prompts.ctx_ids, prompts.starts, prompts.scored, prompts.n_prompts
    contexts, full_resid = [], []
    keys = {layer: np.zeros(cfg.ffn, np.float64) for layer in layers}
    inputs = {layer: np.zeros(cfg.hidden, np.float64) for layer in layers}
    mlp_norm = 0.0
    for j, (got, s) in enumerate(zip(captured, starts)):
        ids = ctx_ids[j]
        resid = got[f"blocks.{first}.hook_resid_mid"]
        full_resid.append(resid)
        contexts.append(TailContext(np.asarray(ids, np.int64), s, resid[s:]))
        if j < n_prompts:
            for layer in layers:
                keys[layer] += got[f"blocks.{layer}.mlp.hook_post"][s]
                resid_s = got[f"blocks.{layer}.hook_resid_mid"][s: s + 1]
                inputs[layer] += norm(cfg, resid_s, model.weights.layers[layer].ffn_norm)[0]
        if j == 0:
            mlp_norm = float(np.mean([np.linalg.norm(got[f"blocks.{layer}.hook_mlp_out"][s]) for layer in layers]))
    offsets = np.cumsum([0] + [c.n for c in contexts])[:-1]
    all_rows = np.concatenate([offsets[sc.ctx] + sc.rows for sc in scored])
    group = _Group(prompts.subject, contexts, scored, n_prompts, {layer: (k / n_prompts).astype(np.float32)
                                                          for layer, k in keys.items()},
                   mlp_norm, all_rows, int(sum(c.n for c in contexts)),
                   inputs={layer: (x / n_prompts).astype(np.float32) for layer, x in inputs.items()})
    for layer in layers:
        group.deltas[layer] = np.zeros(cfg.hidden, np.float32)
        group.m1[layer] = np.zeros(cfg.hidden, np.float64)
        group.m2[layer] = np.zeros(cfg.hidden, np.float64)
    return group, full_resid


def optimise_value(model: Model, facts: Sequence[Fact], layers: Sequence[int], prefixes: Sequence[str],
                   ffn_layers: Callable[[int], DenseLayer] | None = None, max_steps: int = MAX_STEPS,
                   kl_weight: float = KL_WEIGHT) -> ValueResult:
    """Optimise one delta per layer for facts that share a subject (MEMIT-Merge: one key, one value)."""
    return optimise_values(model, [facts], layers, prefixes, ffn_layers, max_steps, kl_weight)[0]


def optimise_values(model: Model, groups: Sequence[Sequence[Fact]], layers: Sequence[int], prefixes: Sequence[str],
                    ffn_layers: Callable[[int], DenseLayer] | None = None, max_steps: int = MAX_STEPS,
                    kl_weight: float = KL_WEIGHT, progress: Callable[[str], None] | None = None,
                    unknown: Collection[str] = (), holds: Mapping[str, Sequence[str]] | None = None,
                    at_last: bool = False) -> list[ValueResult]:
    """One value per subject group, all groups optimised side by side: their prompts go through the
    tail together (one GEMM per weight over every group's rows, each group adding its own delta), each
    group keeps its own loss, candidates and Adam state and leaves the batch when it is done. The
    same numbers as optimising each group alone, in far fewer, larger matrix products.

    Values are kept small (`value_bounds`); the groups whose targets do not all win within those
    bounds are optimised again with ROME's looser ones, and the better of the two results is kept.
    `unknown`: subjects the model says nothing about, held by ROME's KL prompt alone (UNKNOWN_KL_PROMPTS)."""
    decay, clamp = value_bounds(model.name)
    results = _optimise_values(model, groups, layers, prefixes, ffn_layers, max_steps, kl_weight, progress,
                               decay, clamp, unknown, holds, at_last)
    missed = [i for i, r in enumerate(results) if not r.top1]
    if missed and (decay, clamp) != (ROME_WEIGHT_DECAY, ROME_CLAMP):
        again = _optimise_values(model, [groups[i] for i in missed], layers, prefixes, ffn_layers, max_steps,
                                 kl_weight, progress, ROME_WEIGHT_DECAY, ROME_CLAMP, unknown, holds, at_last)
        for i, r in zip(missed, again):
            if r.top1 or r.nll_after < results[i].nll_after:
                results[i] = r
    return results


def _optimise_values(model: Model, groups: Sequence[Sequence[Fact]], layers: Sequence[int], prefixes: Sequence[str],
                     ffn_layers: Callable[[int], DenseLayer] | None, max_steps: int, kl_weight: float,
                     progress: Callable[[str], None] | None, weight_decay: float, clamp: float,
                     unknown: Collection[str] = (),
                     holds: Mapping[str, Sequence[str]] | None = None, at_last: bool = False) -> list[ValueResult]:
    layers = sorted(set(layers))
    first, cfg = layers[0], model.config
    built = _build_groups(model, groups, layers, prefixes, unknown, holds, at_last)
    todo = [g for g, _ in built]
    dense = {i: ffn_layers(i) for i in range(first, cfg.n_layers)} if ffn_layers is not None else None
    tail = Tail(cfg, model.weights, first, layers=dense)
    tail.prepare([c for g in todo for c in g.contexts], [r for _, resid in built for r in resid])
    out = model.weights.output
    active = list(todo)
    for step in range(1, max_steps + 1):
        if not active:
            break
        ctxs = []
        for gi, g in enumerate(active):
            for c in g.contexts:
                c.group = gi
            ctxs += g.contexts
        stacked = {layer: np.stack([g.deltas[layer] for g in active]) for layer in layers}  # (G, hidden)
        offsets = np.cumsum([0] + [g.n_rows for g in active])
        keep = np.concatenate([row + g.all_rows for g, row in zip(active, offsets)])  # the scored rows, in order
        y, saves = tail.forward(ctxs, stacked, keep)  # (R, hidden)
        bounds = np.cumsum([0] + [len(g.all_rows) for g in active])
        ys = [y[lo:hi] for lo, hi in pairwise(bounds)]  # (R_g, hidden) each
        if step == 1 or step % REFRESH == 0:
            _refresh_candidates(out, active, ys, cfg.final_softcap)
        d_rows = np.zeros_like(y)
        for g, y_g, lo, hi in zip(active, ys, bounds[:-1], bounds[1:]):
            assert g.e_c is not None and g.cand is not None and g.ref_p is not None  # set at step 1
            g.nll, g.top1, g.kept, dy = _loss_grad(y_g, g.e_c, g.cand, g.scored, cfg.final_softcap, g.ref_p, kl_weight,
                                           g.n_prompts)
            g.steps = step
            if step == 1:
                g.nll_before = g.nll
            if g.top1 and (g.kept or step > HOLD_STEPS):
                g.extra += 1
            if g.extra > EXTRA_STEPS:  # EXTRA_STEPS = 0: done at its first top-1, before any update
                g.done = True
            if not g.done:
                d_rows[lo:hi] = dy
        if all(g.done for g in active):
            break
        grads = tail.backward(ctxs, stacked, saves, d_rows)
        for gi, g in enumerate(active):
            if g.done:
                continue
            lr = LR * g.mlp_norm / np.sqrt(cfg.hidden)
            max_norm = clamp * g.mlp_norm
            for layer in layers:
                grad = grads[layer][gi].astype(np.float64) + 2 * weight_decay * g.deltas[layer] / g.mlp_norm ** 2
                g.m1[layer] = 0.9 * g.m1[layer] + 0.1 * grad
                g.m2[layer] = 0.999 * g.m2[layer] + 0.001 * grad * grad
                upd = lr * (g.m1[layer] / (1 - 0.9 ** step)) / (np.sqrt(g.m2[layer] / (1 - 0.999 ** step)) + 1e-12)
                d = g.deltas[layer] - upd.astype(np.float32)
                norm = float(np.linalg.norm(d))
                g.deltas[layer] = d * np.float32(max_norm / norm) if norm > max_norm else d
            # its last extra step is made: another forward pass would only show it (a tail pass
            # forward and back each group saved, ~1 in 5.5; the values are the same)
            g.done = g.extra >= max(EXTRA_STEPS, 1)
        active = [g for g in active if not g.done]
        if progress:
            progress(f"value step {step}: {len(todo) - len(active)}/{len(todo)} subjects done")
    results = []
    for g in todo:
        if not all(np.all(np.isfinite(d)) for d in g.deltas.values()):
            raise EditError(f"the value optimisation for {g.subject!r} diverged (non-finite values)")
        results.append(ValueResult(g.deltas, g.keys, g.steps, g.nll_before, g.nll, g.top1, g.n_prompts, g.inputs))
    return results


def _refresh_candidates(out: QuantMatrix, groups: Sequence[_Group], ys: Sequence[F32], softcap: float) -> None:
    """Each group's candidate tokens: its targets and the CANDIDATES likeliest tokens at each of its
    scored rows `ys[g]` (from the full vocabulary, every group's rows in one pass), added to those it
    had; at the first call also the KL prompts' reference distribution, over the candidates."""
    top = out.top_k(np.concatenate(ys), CANDIDATES)  # (sum of R_g, CANDIDATES)
    bounds = np.cumsum([0] + [len(y_g) for y_g in ys])
    for g, y_g, lo, hi in zip(groups, ys, bounds[:-1], bounds[1:]):
        if g.cand is None:
            g.cand = np.union1d(top[lo:hi].reshape(-1), np.concatenate([sc.tokens for sc in g.scored]))
            g.y_ref = y_g[len(y_g) - sum(sc.kl for sc in g.scored):]  # the KL prompts are scored last, before any edit
        else:
            g.cand = np.union1d(g.cand, top[lo:hi].reshape(-1))
        assert g.y_ref is not None
        g.e_c = out.rows(g.cand)  # (K, hidden), dequantized once per candidate set, not per step
        ref_c = (g.y_ref @ g.e_c.T).astype(np.float64)  # (n_kl, K)
        if softcap:
            ref_c = np.tanh(ref_c / softcap) * softcap
        ref_p = np.exp(ref_c - ref_c.max(axis=1, keepdims=True))
        g.ref_p = ref_p / ref_p.sum(axis=1, keepdims=True)


def _loss_grad(y: F32, e_c: F32, cand: NDArray[np.int64], scored: list[_Scored], softcap: float,
               ref_p: NDArray[np.float64], kl_weight: float, n_prompts: int) -> tuple[float, bool, bool, F32]:
    """Mean target NLL over the prompts (each prompt's tokens averaged), whether every target token
    is the top-1, and d(NLL + kl_weight * KL) / d y for the scored rows `y` `(R, hidden)`."""
    z = y @ e_c.T  # (R, K)
    capped = None
    if softcap:
        capped = np.tanh(z / np.float32(softcap))
        z = capped * np.float32(softcap)
    z64 = z.astype(np.float64)
    logp = z64 - z64.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    p = np.exp(logp)
    pos = {int(t): i for i, t in enumerate(cand)}
    dz = np.zeros_like(z64)
    nll, top1, kept, row, k = 0.0, True, True, 0, 0
    for sc in scored:
        n = len(sc.rows)
        if sc.kl:
            dz[row] = kl_weight * sc.weight * (p[row] - ref_p[k])
            if sc.keep:
                kept &= bool(np.argmax(p[row]) == np.argmax(ref_p[k]))
            k += 1
        else:
            idx = np.array([pos[int(t)] for t in sc.tokens])
            r = np.arange(row, row + n)
            nll -= float(logp[r, idx].sum()) / n / n_prompts
            top1 &= bool(np.all(np.argmax(logp[r], axis=1) == idx))
            dz[r] += p[r] / n / n_prompts
            dz[r, idx] -= 1.0 / n / n_prompts
        row += n
    if capped is not None:
        dz = dz * (1.0 - capped.astype(np.float64) ** 2)
    return nll, top1, kept, (dz @ e_c).astype(np.float32)
