"""REBALANCE: re-tune the facts INSERT (METHOD FEATURE) installed at a layer against each other, and
report each fact's p(target | its prompt) before and after.

INSERT does this implicitly for the facts at its layer, one insert at a time: it rebuilds the
earlier facts' gates against the new prompt (the "cliff-breaker", feature.selective) and
searches the new feature's down scale alone. After several inserts, a MERGE or an APPLY PATCH, the
facts at a layer were never tuned all together. REBALANCE, per layer:
1. rebuilds every installed fact's gate and up against the decoys and every other fact's prompt
   at the layer (so no feature fires on another fact's prompt);
2. LARQL's global loop: while a fact's p is below FLOOR its down vector grows x1.15, above
   CEILING it shrinks x0.85 (within MAX_SCALE x the layer's median down norm), until every fact is
   in the band, nothing changes, or MAX iterations;
3. records one update per fact (gate, up, down, c_score = its new p), all or nothing.
Weight edits (ROME / MEMIT) have no per-fact feature to re-tune and are left as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from larql.edit.methods.defaults import (
    REBALANCE_CEILING,
    REBALANCE_CONVERGED_MAX,
    REBALANCE_FLOOR,
    REBALANCE_GROW,
    REBALANCE_MAX,
    REBALANCE_SHRINK,
)
from larql.edit.methods.feature import (
    DECOY_ENTITIES,
    DECOY_PROMPTS,
    MAX_SCALE,
    ffn_inputs,
    relation_prompt,
    selective,
)
from larql.edit.patches.overlay import MetaOverride
from larql.edit.patches.patch import PatchOp
from larql.edit.state.edited import installed
from larql.edit.state.view import EditableVindex
from larql.errors import EditError, VindexError
from larql.model.generate import log_softmax
from larql.model.targets import first_target_token

DEFAULT_MAX, CONVERGED_MAX = REBALANCE_MAX, REBALANCE_CONVERGED_MAX
DEFAULT_FLOOR, DEFAULT_CEILING = REBALANCE_FLOOR, REBALANCE_CEILING
GROW, SHRINK = REBALANCE_GROW, REBALANCE_SHRINK


@dataclass(frozen=True)
class FactBalance:
    label: str  # entity -[relation]-> target
    layer: int
    feature: int
    p_before: float
    p_after: float
    down_factor: float  # |down| after / before


@dataclass
class RebalanceReport:
    facts: list[FactBalance] = field(default_factory=list)
    iterations: int = 0
    converged: bool = True  # every fact ended in [floor, ceiling], or nothing more could change
    layers: list[int] = field(default_factory=list)
    ops: int = 0


def feature_layers(v: EditableVindex) -> list[int]:
    """The layers holding feature inserts with a fact."""
    return [layer for layer in range(v.num_layers) if installed(v, layer)]


def rebalance(v: EditableVindex, layer: int | None = None, max_iters: int | None = None,
              floor: float | None = None, ceiling: float | None = None, until_converged: bool = False) -> RebalanceReport:
    """Re-tune the installed facts at `layer` (every layer holding some when None); see above."""
    floor = DEFAULT_FLOOR if floor is None else floor
    ceiling = DEFAULT_CEILING if ceiling is None else ceiling
    if not 0.0 <= floor < ceiling <= 1.0:
        raise EditError(f"REBALANCE needs 0 <= FLOOR < CEILING <= 1, got FLOOR {floor} and CEILING {ceiling}")
    limit = max_iters if max_iters is not None else (CONVERGED_MAX if until_converged else DEFAULT_MAX)
    if limit < 1:
        raise EditError(f"REBALANCE ... MAX must be at least 1, got {limit}")
    if not v.has_model_weights:
        raise EditError("REBALANCE needs the model's weights: extract the vindex WITH INFERENCE")
    if layer is not None and not 0 <= layer < v.num_layers:
        raise EditError(f"layer {layer} is out of range (layers 0-{v.num_layers - 1})")
    report = RebalanceReport(layers=[layer] if layer is not None else feature_layers(v))
    moe = next((L for L in report.layers if v.num_experts(L)), None)
    if moe is not None:  # its facts sit in different experts, each weighed by the router: not one FFN to tune
        raise EditError(f"REBALANCE re-tunes the facts of one dense FFN; layer {moe} of {v.index['family']} is a "
                        f"mixture of {v.num_experts(moe)} experts (re-INSERT a fact there to re-tune it)")
    ops: list[PatchOp] = []
    for L in report.layers:
        layer_ops, facts, iters, done = _rebalance_layer(v, L, limit, floor, ceiling)
        ops += layer_ops
        report.facts += facts
        report.iterations = max(report.iterations, iters)
        report.converged &= done
    v.patches.record_all(list(ops))
    report.ops = len(ops)
    return report


def _rebalance_layer(v: EditableVindex, L: int, limit: int, floor: float,
                     ceiling: float) -> tuple[list[PatchOp], list[FactBalance], int, bool]:
    facts = sorted(installed(v, L), key=lambda op: op.feature)
    if not facts:
        return [], [], 0, True
    model = v.model()
    overlay = v.overlay
    prompts = [relation_prompt(op.entity or "", op.relation or "") for op in facts]
    tids = [first_target_token(model, op.target or "") for op in facts]
    ids = [model.tokenize(p) for p in prompts]

    def probs() -> list[float]:
        return [float(np.exp(log_softmax(model.next_logits(i))[t])) for i, t in zip(ids, tids)]

    before = probs()
    hs = [ffn_inputs(model, [p], L, last_only=False)[0] for p in prompts]
    snap = overlay.snapshot([(L, op.feature) for op in facts])
    downs = []
    for op in facts:
        col = overlay[(L, op.feature)].down
        if col is None:
            raise VindexError(f"REBALANCE: the fact at L{L} F{op.feature} has no down vector in the overlay")
        downs.append(col)
    down = model.weights.layers[L].down
    assert down is not None  # a dense FFN: a mixture of experts has no feature slots
    down_cols = down.dequantize()
    cap = MAX_SCALE * float(np.median(np.linalg.norm(down_cols, axis=0)))
    gates = []
    try:
        neutral = [d for d in DECOY_PROMPTS if d not in prompts]
        h_neutral, _ = ffn_inputs(model, neutral, L, last_only=True)  # captured once per layer
        for i, op in enumerate(facts):  # 1. every gate against the decoys and every other prompt
            templated = [d for e in DECOY_ENTITIES if e.lower() != (op.entity or "").lower()
                         and (d := relation_prompt(e, op.relation or "")) not in prompts]
            h_decoys = np.concatenate([h_neutral, ffn_inputs(model, templated, L, last_only=True)[0]]) \
                if templated else h_neutral
            rest = [h[-1:] for j, h in enumerate(hs) if j != i]
            try:
                g, u = selective(hs[i], np.concatenate([h_decoys] + rest), h_decoys.mean(axis=0))
            except VindexError:
                raise EditError(f"REBALANCE: at layer {L}, the prompt {prompts[i]!r} cannot be told apart from the "
                                "decoys and the other facts there; DELETE one of them or move it (INSERT ... AT LAYER n)") from None
            gates.append((g, u))
        for op, (g, u), col in zip(facts, gates, downs):
            PatchOp("update", L, op.feature, {"gate": g, "up": u, "down": col}).apply(overlay)
        scales = [1.0] * len(facts)
        iters, converged = 0, False
        p = probs()
        while iters < limit:  # 2. LARQL's loop over the band
            changed = False
            for i, pi in enumerate(p):
                norm = float(np.linalg.norm(downs[i])) * scales[i]
                if pi < floor and norm * GROW <= cap:
                    scales[i] *= GROW
                elif pi > ceiling:
                    scales[i] *= SHRINK
                else:
                    continue
                changed = True
                PatchOp("update", L, facts[i].feature, {"down": downs[i] * np.float32(scales[i])}).apply(overlay)
            iters += 1
            p = probs() if changed else p
            converged = all(floor <= x <= ceiling for x in p)
            if converged or not changed:
                break
    finally:
        overlay.restore(snap)
    ops = [PatchOp("update", L, op.feature, {"gate": g, "up": u, "down": d * np.float32(s)},
                   MetaOverride((t,), (round(pa, 4),)), reason="REBALANCE")
           for op, (g, u), d, s, t, pa in zip(facts, gates, downs, scales, tids, p)]
    report = [FactBalance(f"{op.entity} -[{op.relation}]-> {op.target}", L, op.feature, b, a, s)
              for op, b, a, s in zip(facts, before, p, scales)]
    return ops, report, iters, converged
