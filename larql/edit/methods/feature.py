"""INSERT: teach the model one fact by installing a feature in one FFN layer, through the overlay.

The install, for (entity, relation, target) at layer L:
0. The layer: AT LAYER, else the first layer of the output band, moving later while the goal is not
   reached (on gemma3-270m the knowledge band's last layers reach it for fewer facts and leak more).
1. The prompt is the relation's template ("The capital of {} is" for the relations probes.py knows,
   else LARQL's "The {relation} of {entity} is"); the target is the first token of " " + target.
2. Capture the FFN input h (the normalised residual at L) at the prompt's last position, and at
   the "decoys": the last positions of neutral prompts, of the same template about other entities,
   and the prompt's own earlier positions.
3. Slot: the feature at L that matters least on the decoys (mean |activation| x |down column|),
   not already edited (re-inserting the same entity and relation reuses its slot).
4. gate = up = the part of h orthogonal to every decoy h and to the prompts of the facts already
   installed at L (so the feature is silent there, and act(gate.h) * up.h falls off quadratically
   away from the prompt); gate scaled to a strong pre-activation, up to up.h = 1. The facts already
   at L are re-tuned the same way against the new prompt (recorded as updates), so that no fact's
   feature fires on another's prompt (LARQL's "cliff-breaker").
5. down = the direction that raises the target's logit most directly (the target's unembedding
   row, through the final norm's weight and, for Gemma, the post-FFN norm's weight), scaled by a
   search: the smallest scale at which p(target | prompt) reaches the goal (default 0.9,
   `confidence`), or the best reached before p stops improving.
6. Measured: p(target) and its rank before and after (efficacy); p(target) on the relation's
   few-shot form (generalisation, for the relations probes.py knows); on held-out neutral prompts,
   the mean KL(before || after) of the next-token distribution and how many keep their top-1
   (locality). These are EasyEdit's three measures, on one fact.
The result is a PatchOp (vectors + metadata) recorded on the editable view's patch stack.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from larql.edit.patches.overlay import MetaOverride
from larql.edit.patches.patch import PatchOp
from larql.edit.state.edited import EditTarget, installed
from larql.errors import VindexError
from larql.model.ffn import gated
from larql.model.forward import norm
from larql.model.generate import log_softmax
from larql.model.interp import kl, rank_of
from larql.model.targets import first_target_token
from larql.vindex.probes import TEMPLATES, probe_prompt

F32 = NDArray[np.float32]

# Captured as decoys: the inserted feature should stay silent here.
DECOY_PROMPTS = ("Once upon a time", "The quick brown fox", "To be or not to be", "Water is a",
                 "The weather today is", "My favourite food is", "In the morning I", "The answer is",
                 "She opened the door and", "The best way to learn is")
DECOY_ENTITIES = ("Germany", "Japan", "the moon", "music", "Brazil", "a cat")
# Held out for measuring locality (never captured).
CHECK_PROMPTS = ("The capital of Germany is", "The sun rises in the", "Two plus two equals",
                 "The largest ocean on Earth is the", "A dog is a kind of", "The opposite of hot is",
                 "Paris is a city in", "The colour of grass is")
PRE_ACTIVATION = 12.0  # gate . h at the prompt: deep in the linear part of GELU / SiLU
# The feature fires only where h is at least 70% as close as the prompt (see selective): lower
# thresholds moved the neighbours' distributions more for the same few-shot probability
# (docs/design/edit-defaults.md)
THRESHOLD = 0.7
MAX_SCALE = 32.0  # the down vector stays within 32x the layer's median down-column norm: beyond, edits leak


@dataclass(frozen=True)
class InsertReport:
    entity: str
    relation: str
    target: str
    prompt: str
    layer: int
    feature: int
    target_id: int
    target_token: str
    p_before: float
    p_after: float
    rank_before: int
    rank_after: int
    down_scale: float
    locality_kl: float  # mean KL(before || after) over CHECK_PROMPTS
    locality_top1: int  # how many CHECK_PROMPTS keep their top-1
    locality_total: int
    paraphrase: str | None = None  # the few-shot form of the prompt, for relations probes.py knows
    p_paraphrase_before: float | None = None
    p_paraphrase_after: float | None = None


def relation_prompt(entity: str, relation: str) -> str:
    key = relation.strip().lower().replace("_", "-")
    for t in TEMPLATES:
        if t.relation == key or t.relation.replace("-", " ") == key.replace("-", " "):
            return t.template.format(entity)
    words = relation.replace("-", " ").replace("_", " ").strip()
    return f"The {words} of {entity} is"


def ffn_inputs(model: object, prompts: list[str], layer: int, last_only: bool) -> tuple[F32, F32 | None]:
    """(FFN inputs h `[n, hidden]`, activations `[n, ffn]`) at `layer` for the prompts' positions;
    no activations for a mixture of experts (there is no one FFN: see `_slot_ffn`)."""
    cfg, lw = model.config, model.weights.layers[layer]  # type: ignore[attr-defined]
    names = [f"blocks.{layer}.hook_resid_mid"] + ([] if lw.router is not None else [f"blocks.{layer}.mlp.hook_post"])
    hs, acts = [], []
    for p in prompts:
        _, cache = model.run_with_cache(model.tokenize(p), names=names)  # type: ignore[attr-defined]
        resid = cache[names[0]][-1:] if last_only else cache[names[0]]
        hs.append(norm(cfg, resid, lw.ffn_norm, lw.ffn_norm_bias))
        if len(names) > 1:
            acts.append(cache[names[1]][-1:] if last_only else cache[names[1]])
    return np.concatenate(hs), np.concatenate(acts) if acts else None


def _slot_ffn(model: object, layer: int, h_prompt: F32, h_decoys: F32, acts: F32 | None) -> tuple[int, F32, F32]:
    """(the first feature number of the FFN the slot is taken from, its W_down `(hidden, ffn)`, the
    decoys' activations `(n, ffn)`). In a mixture of experts, the FFN is the expert the router
    weighs most at the prompt's last position (expert e's features are numbered from e x ffn), so
    the feature acts where the prompt goes; its weight there is absorbed by the down scale search."""
    lw = model.weights.layers[layer]  # type: ignore[attr-defined]
    if lw.router is None:
        assert lw.down is not None and acts is not None  # a dense FFN
        return 0, lw.down.dequantize(), acts
    e = int(np.argmax(lw.router.matmul(h_prompt[None, :])[0]))
    gate, up, down = lw.experts[e]
    act = gated(model.config.activation, gate.matmul(h_decoys), up.matmul(h_decoys))  # type: ignore[attr-defined]
    return e * gate.n_rows, down.dequantize(), act


def _orthogonal_part(target: F32, others: F32) -> F32:
    """target minus its projection on the span of `others` (rows), via a QR basis."""
    basis, r = np.linalg.qr(others.astype(np.float64).T)  # (hidden, n)
    keep = np.abs(np.diag(r)) > 1e-6 * max(1.0, float(np.abs(np.diag(r)).max(initial=0.0)))
    basis = basis[:, keep]
    t = target.astype(np.float64)
    return (t - basis @ (basis.T @ t)).astype(np.float32)


def target_direction(model: object, layer: int, target_id: int) -> F32:
    """The unit FFN output that most raises the target's logit: its unembedding row through the
    final norm's weight, and for Gemma through the post-FFN norm's weight (which scales the
    normalised FFN output elementwise, so the best direction is the product, not the quotient)."""
    w = model.weights  # type: ignore[attr-defined]
    d = w.output.row(target_id) * w.output_norm  # (hidden,) d logit / d (normed residual)
    post = w.layers[layer].post_ffn_norm
    if post is not None:
        d = d * post
    return (d / np.linalg.norm(d)).astype(np.float32)


def _distributions(model: object, prompts: tuple[str, ...]) -> list[F32]:
    return [log_softmax(model.next_logits(model.tokenize(p))) for p in prompts]  # type: ignore[attr-defined]


def selective(h_all: F32, suppress: F32, common: F32) -> tuple[F32, F32]:
    """gate and up for a feature that fires on h_all[-1] and not on `suppress` nor h_all[:-1].

    u, the part of the target orthogonal to everything suppressed, measures c(h) = u.h / u.target
    (1 at the prompt). The FFN has no bias, but FFN inputs share a common component (`common`, the
    decoys' mean: r(h) = common.h / |common|^2 is ~1 on ordinary positions), which serves as one:
    gate.h = k (c(h) - THRESHOLD r(h) / r(target)) stays negative, so GELU/SiLU stay near zero,
    wherever h is less than THRESHOLD as close to the prompt as the prompt itself.
    """
    target = h_all[-1]
    u = _orthogonal_part(target, np.concatenate([suppress, h_all[:-1]]))
    along = float(u @ target)
    if along <= 1e-6 * float(target @ target):
        raise VindexError("the prompt is indistinguishable from the decoys and other facts at this layer")
    mm = float(common @ common)
    r_target = float(common @ target) / mm
    c = u / np.float32(along)  # c . target = 1
    if r_target > 0.1:
        bias = common * np.float32(THRESHOLD / (r_target * mm))  # bias . target = THRESHOLD
        gate = (c - bias) * np.float32(PRE_ACTIVATION / (1.0 - THRESHOLD))
    else:  # no usable common component at this layer: a plain projection
        gate = c * np.float32(PRE_ACTIVATION)
    return gate.astype(np.float32), c.astype(np.float32)


def plan_insert(vindex: EditTarget, entity: str, relation: str, target: str, layer: int | None = None,
                goal: float = 0.9) -> tuple[list[PatchOp], InsertReport]:
    """Find the slot and vectors that make the model answer `target`; records nothing (see
    `insert`). Returns the insert and, first, updates that re-tune the facts already installed at
    the layer so that none fires on another's prompt. The search runs through the vindex's overlay,
    which is restored afterwards."""
    v = vindex
    if not v.has_model_weights:
        raise VindexError("INSERT needs the model's weights: extract the vindex WITH INFERENCE")
    model = v.model()
    cfg = model.config
    if layer is None:  # the first output-band layer; later ones if the goal is not reached there
        first = min(v.index["layer_bands"]["output"][0], cfg.n_layers - 1)
        chosen: tuple[list[PatchOp], InsertReport] | None = None
        for candidate in range(first, cfg.n_layers):
            ops, report = plan_insert(v, entity, relation, target, candidate, goal)
            if chosen is None or report.p_after > chosen[1].p_after:
                chosen = (ops, report)
            if report.p_after >= goal:
                break
        assert chosen is not None
        return chosen
    if not 0 <= layer < cfg.n_layers:
        raise VindexError(f"layer {layer} is out of range (layers 0-{cfg.n_layers - 1})")
    if not 0.0 < goal < 1.0:
        raise VindexError(f"CONFIDENCE must be between 0 and 1 (exclusive), got {goal}")
    prompt = relation_prompt(entity, relation)
    tid = first_target_token(model, target)
    overlay = v.overlay
    template = next((t for t in TEMPLATES if relation_prompt(entity, t.relation) == prompt), None)
    paraphrase = probe_prompt(template, entity) if template is not None else None

    def p_of(text: str) -> float:
        return float(np.exp(log_softmax(model.next_logits(model.tokenize(text)))[tid]))

    ids = model.tokenize(prompt)
    before = log_softmax(model.next_logits(ids))
    para_before = p_of(paraphrase) if paraphrase else None
    checks_before = _distributions(model, CHECK_PROMPTS)
    h_all, _ = ffn_inputs(model, [prompt], layer, last_only=False)
    decoy_prompts = list(DECOY_PROMPTS) + [relation_prompt(e, relation) for e in DECOY_ENTITIES
                                           if e.lower() != entity.lower()]
    h_decoys, acts = ffn_inputs(model, decoy_prompts, layer, last_only=True)
    common = h_decoys.mean(axis=0)  # (hidden,) what ordinary positions share

    # facts already installed here: the same (entity, relation) is replaced in its own slot
    others = installed(v, layer)
    same = [op for op in others if op.entity == entity and (op.relation or "").lower() == relation.lower()]
    others = [op for op in others if op not in same]
    other_h = [ffn_inputs(model, [relation_prompt(op.entity or "", op.relation or "")], layer, last_only=False)[0]
               for op in others]

    first, down_cols, acts = _slot_ffn(model, layer, h_all[-1], h_decoys, acts)  # down_cols: (hidden, ffn)
    if same:
        feature = same[0].feature
    else:
        importance = np.abs(acts).mean(axis=0) * np.linalg.norm(down_cols, axis=0)  # (ffn,)
        taken = set(overlay.layer(layer)) | overlay.deleted(layer) | set(overlay.meta(layer))
        feature = next(first + int(f) for f in np.argsort(importance, kind="stable") if first + int(f) not in taken)
    try:
        gate, up = selective(h_all, np.concatenate([h_decoys] + [h[-1:] for h in other_h]), common)
    except VindexError:
        raise VindexError(f"INSERT: the prompt {prompt!r} is indistinguishable from the decoy prompts and the "
                          f"facts installed at layer {layer}; try another layer (AT LAYER n)") from None
    retuned = []
    for i, (op, h) in enumerate(zip(others, other_h)):
        own = relation_prompt(op.entity or "", op.relation or "")
        decoys = h_decoys[[d != own for d in decoy_prompts]]  # a decoy may be this fact's own prompt
        rest = [x[-1:] for j, x in enumerate(other_h) if j != i] + [h_all[-1:]]
        g, u = selective(h, np.concatenate([decoys] + rest), common)
        retuned.append(PatchOp("update", layer, op.feature, {"gate": g, "up": u}))
    unit_down = target_direction(model, layer, tid)
    ref = float(np.median(np.linalg.norm(down_cols, axis=0)))

    snap = overlay.snapshot([(layer, feature)] + [(layer, op.feature) for op in others])
    for op in retuned:
        op.apply(overlay)

    def p_at(scale: float) -> float:
        PatchOp("insert", layer, feature, {"gate": gate, "up": up, "down": unit_down * np.float32(scale)}).apply(overlay)
        return float(np.exp(log_softmax(model.next_logits(ids))[tid]))

    try:
        scale, best, stale = ref / 16.0, (-1.0, ref), 0
        while scale <= MAX_SCALE * ref:  # grow until the goal is reached, or p stops improving
            p = p_at(scale)
            stale = stale + 1 if p <= best[0] * 1.05 else 0
            best = max(best, (p, scale))
            if p >= goal or stale >= 2:
                break
            scale *= 2.0
        if best[0] >= goal:  # shrink back: the smallest scale that still reaches the goal
            lo, hi = scale / 2.0, scale
            for _ in range(6):
                mid = (lo + hi) / 2.0
                if p_at(mid) >= goal:
                    hi = mid
                else:
                    lo = mid
            scale = hi
        else:
            scale = best[1]
        p_after = p_at(scale)
        after = log_softmax(model.next_logits(ids))
        checks_after = _distributions(model, CHECK_PROMPTS)
        para_after = p_of(paraphrase) if paraphrase else None
    finally:
        overlay.restore(snap)

    kls = [kl(b, a) for b, a in zip(checks_before, checks_after)]
    kept = sum(int(np.argmax(b) == np.argmax(a)) for b, a in zip(checks_before, checks_after))
    op = PatchOp("insert", layer, feature, {"gate": gate, "up": up, "down": unit_down * np.float32(scale)},
                 MetaOverride((tid,), (round(p_after, 4),)), entity, relation, target)
    report = InsertReport(entity, relation, target, prompt, layer, feature, tid, model.tokenizer.token_text(tid),
                          float(np.exp(before[tid])), p_after, rank_of(before, tid), rank_of(after, tid), scale, float(np.mean(kls)), kept, len(CHECK_PROMPTS),
                          paraphrase, para_before, para_after)
    return retuned + [op], report


def insert(vindex: EditTarget, entity: str, relation: str, target: str, layer: int | None = None,
           goal: float = 0.9) -> InsertReport:
    """Install the fact and record it on the vindex's patch stack (inference changes at once)."""
    ops, report = plan_insert(vindex, entity, relation, target, layer, goal)
    for op in ops:
        vindex.patches.record(op)
    return report
