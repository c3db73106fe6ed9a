"""INSERT of one or many facts into an editable vindex, by any method, with an honest report.

Methods:
- "rome"    one weight edit per fact (facts about one subject share it), solved one after another,
            each holding the earlier ones' keys still;
- "memit"   all facts in one joint solve per layer (EMMET's equality-constrained MEMIT);
- "feature" LARQL's INSERT: one selective FFN feature per fact (edit/methods/feature.py).
`defaults.default_method` is whichever measured best for the model (benchmarks/bench_editing.py; README).

Every INSERT is recorded on the patch stack as a whole or not at all, and reports, per fact,
efficacy (the prompt), generalisation and locality measured on prompts it did NOT optimise on:
the prompt behind model-written prefixes of another seed, the user's paraphrases, and a broad set
of unrelated prompts (top-1 kept, KL).
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from larql.edit.measure.evaluate import EVAL_PREFIX_SEED, EVAL_PREFIXES, Scorer, unrelated_logps
from larql.edit.methods.capture import LowerLayers
from larql.edit.methods.defaults import (
    METHODS,
    N_NEIGHBOURS,
    NEURONS_PER_LAYER,
    default_layer,
    default_method,
    neuron_layers,
    neuron_prefixes,
    subject_keys,
)
from larql.edit.methods.facts import Fact, model_prefixes
from larql.edit.methods.neighbours import similar_subjects
from larql.edit.methods.neuron import bias_direction, plan_neuron_edit
from larql.edit.methods.neuron_settle import settle_layer, settle_texts
from larql.edit.methods.relations import RelationCheck, known_edges, known_relations, recheck, relation_holds
from larql.edit.methods.rome import KeyMetric
from larql.edit.methods.stats import second_moments, token_budget
from larql.edit.methods.weight_edit import (
    DECOY_SUBJECTS,
    HeldMemo,
    HeldPrompt,
    WeightEditPlan,
    known_objects_many,
    plan_weight_edit,
)
from larql.edit.patches.weight_op import WeightOp
from larql.edit.state.edited import EditTarget, installed, neuron_subjects
from larql.errors import EditError
from larql.model.grad import require_backward
from larql.model.interp import kl
from larql.model.model import Model
from larql.model.tokenizer import cache_dir
from larql.vindex.tokens import Edge


def default_layers(model: Model) -> tuple[int, ...]:
    return (default_layer(model.name, model.config.n_layers),)


def stats_dir(v: EditTarget) -> Path:
    """Beside the vindex (`g.vindex.stats/`) when that directory is writable, else the cache."""
    beside = v.path.parent / f"{v.path.name}.stats"
    if beside.is_dir() or (v.path.parent.exists() and _writable(v.path.parent)):
        return beside
    return cache_dir() / "stats" / v.path.name


def _writable(p: Path) -> bool:
    return os.access(p, os.W_OK)


# id(weights) -> {(layer, tokens, point): KeyMetric}. The statistics are the weights' (their cache file is
# named by them), so every model over the same weights shares them: a server's sessions, `with_edits`,
# `dense()`. An entry goes when its weights do (Weights, holding arrays, cannot be a dictionary key).
_metrics: dict[int, dict[tuple[int, int, str], KeyMetric]] = {}


def _metrics_of(model: Model) -> dict[tuple[int, int, str], KeyMetric]:
    key = id(model.weights)
    if key not in _metrics:
        weakref.finalize(model.weights, _metrics.pop, key, None)
    return _metrics.setdefault(key, {})


def key_metrics(model: Model, layers: Sequence[int], directory: Path | None,
                n_tokens: int | None = None, point: str = "key") -> dict[int, KeyMetric]:
    """C (+ ridge), factored, per layer: from memory, the statistics cache, or computed; of the
    down projection's input (`point="key"`) or of the MLP's normalised input ("input"). Computed on
    the dense model, so that they are the same whichever model over these weights asks first."""
    n_tokens = n_tokens or token_budget(model.config.ffn)
    have = _metrics_of(model)
    missing = [layer for layer in layers if (layer, n_tokens, point) not in have]
    if missing:
        for layer, got in second_moments(model.dense(), missing, directory, n_tokens, point).items():
            bias = bias_direction(got.cov, got.mean) if point == "input" else None
            have[(layer, n_tokens, point)] = KeyMetric(got.cov, bias=bias)
    return {layer: have[(layer, n_tokens, point)] for layer in layers}


def neuron_layer_plan(v: EditTarget, model: Model, subjects: Sequence[str],
                      layers: Sequence[int] | None) -> dict[int, set[str]]:
    """Which layer each subject's neuron goes to: `layers` given, spread evenly over them; else the
    model's `neuron_layers` in order, each filled up to NEURONS_PER_LAYER neurons (counting those
    already installed), then the emptiest."""
    candidates = tuple(dict.fromkeys(layers)) if layers else neuron_layers(model.name, model.config.n_layers)
    count = {layer: len(installed(v, layer, neurons=True)) for layer in candidates}
    out: dict[int, set[str]] = {}
    for subject in subjects:
        room = [layer for layer in candidates if count[layer] < NEURONS_PER_LAYER] if not layers else []
        layer = room[0] if room else min(candidates, key=lambda c: (count[c], candidates.index(c)))
        count[layer] += 1
        out.setdefault(layer, set()).add(subject)
    return out


@dataclass(frozen=True)
class FactReport:
    fact: Fact
    p_before: float  # probability of the whole target on the prompt (product of its tokens)
    p_after: float
    top1_before: bool  # every token of the target the top-1 (teacher-forced) on the prompt
    top1_after: bool
    held_out_before: float  # mean whole-target probability on held-out forms of the prompt
    held_out_after: float
    held_out_top1: float  # fraction of held-out forms where every target token is the top-1


@dataclass
class InsertReport:
    method: str
    layers: tuple[int, ...]
    facts: list[FactReport]
    unrelated_kept: int  # unrelated prompts whose top-1 did not change
    unrelated_total: int
    unrelated_kl: float  # mean KL(before || after) over them
    seconds: float
    ops: int  # patch operations recorded
    notes: list[str] = field(default_factory=list)
    plan: WeightEditPlan | None = None
    relations: list[RelationCheck] = field(default_factory=list)  # the subjects' other relations, before and after

    @property
    def relations_kept(self) -> int:
        return sum(c.kept for c in self.relations)


SIBLING_NAME = "Acme"  # another entity ending in the subject's last word, for the report's sibling check


def sibling_prompt(f: Fact) -> str | None:
    """The fact's prompt about another entity that ends alike ("Acme Pharma was founded by" for
    "Dreitromen Pharma"), for a subject of several words; else None. An edit keyed on the last word
    answers there too (a lone "Dreitromen Pharma" taught Akio Morita to "Lefel Pharma" and "Teva
    Pharma" as well; keyed on "Dreitromen" it did not)."""
    words = f.subject.split()
    return f.prompt.replace(f.subject, f"{SIBLING_NAME} {words[-1]}", 1) if len(words) > 1 else None


def _probe(sc: Scorer, prompts: Sequence[str], target: str) -> tuple[float, float]:
    """(mean whole-target probability, fraction with every target token the top-1)."""
    ps, tops = [], []
    for p in prompts:
        toks = sc.token_logps(sc.prompt(p), target)
        ps.append(float(np.exp(sum(x for x, _ in toks))))
        tops.append(float(all(t for _, t in toks)))
    return float(np.mean(ps)), float(np.mean(tops))


def insert_facts(v: EditTarget, facts: Sequence[Fact], method: str | None = None,
                 layers: Sequence[int] | None = None, progress: Callable[[str, int, int], None] | None = None,
                 measure: bool = True, decoys: Sequence[str] | None = None,
                 n_neighbours: int = N_NEIGHBOURS, exclude: Collection[str] = (),
                 stats_tokens: int | None = None, hold_objects: bool = True,
                 hold_relations: bool = True) -> InsertReport:
    """Teach `facts` to the vindex's model through its overlay (recorded on its patch stack, all or
    nothing) and measure the result on held-out prompts.

    Weight edits hold still the keys of `decoys` and of each subject's `n_neighbours` nearest
    subjects in the embedding, except words in `exclude` (an evaluation's held-out subjects), weighted
    by key statistics over `stats_tokens` tokens (default `stats.token_budget`), and with
    `hold_objects` the keys of what the model says each subject relates to (`known_objects_many`)."""
    method = method or default_method(v.index["model"])
    if method not in METHODS:
        raise EditError(f"unknown edit method {method!r} (one of {', '.join(METHODS)})")
    if not facts:
        raise EditError("INSERT needs at least one fact")
    if not v.has_model_weights:
        raise EditError("INSERT needs the model's weights: extract the vindex WITH INFERENCE")
    model = v.model()
    if method != "feature":  # before minutes of statistics, not after
        require_backward(model.config, model.weights)
    t0 = time.perf_counter()
    # its batched passes (probes, captures, the value step's tail, settling, the report) then dequantize
    # nothing: 1,000 fictional facts spent ~20 s dequantizing, one fact ~0.3 s of ~2.8
    _float32_weights = v.float32_weights()  # held at least while this INSERT runs
    held_prefixes = model_prefixes(model, EVAL_PREFIXES, seed=EVAL_PREFIX_SEED) if measure else ()
    sc = Scorer(model)

    def held_out(f: Fact) -> list[str]:
        return [p + f.prompt for p in held_prefixes]

    edges: list[list[Edge]] = []

    def probed() -> list[list[Edge]]:
        """DESCRIBE's probe edges of each subject, read once for the holds and the report."""
        if not edges:
            edges.extend(known_edges(model, list(dict.fromkeys(f.subject for f in facts))))
        return edges

    before = []
    if measure:
        siblings = {f: s for f in facts if (s := sibling_prompt(f)) is not None}
        checks = [(p, f.target) for f in facts for p in (f.prompt, *held_out(f))]
        sc.prefetch(checks := checks + [(s, f.target) for f, s in siblings.items()])  # one batch
        for f in facts:
            p, top = _probe(sc, [f.prompt], f.target)
            before.append((p, top, _probe(sc, held_out(f), f.target)[0]))
        sibling_before = {f: _probe(sc, [s], f.target)[1] for f, s in siblings.items()}
        unrelated_before = unrelated_logps(model)
        relations_before = known_relations(model, facts, probed())
    recorded = len(v.patches.pending)
    plan = None
    if method == "feature":
        from larql.edit.methods.feature import plan_insert

        ops = []
        for f in facts:
            feature_ops, _ = plan_insert(v, f.subject, f.relation or "relation", f.target,
                                         None if layers is None else layers[0])
            v.patches.record_all(list(feature_ops))  # later facts re-tune against earlier ones
            ops += feature_ops
        used = tuple(sorted({op.layer for op in ops}))
    else:  # a neuron or weight edit holds still each subject's nearest subjects and known objects
        subjects = list(dict.fromkeys(f.subject for f in facts))  # probed once per subject, not per fact
        keys = {s: s for s in subjects}
        if method == "neuron":  # a neuron keys on what tells its subject from the others, in place and new
            keys = subject_keys([*subjects, *neuron_subjects(v)])
            facts = [f if f.key else replace(f, key=keys[f.subject]) for f in facts]
            keys |= {f.subject: f.keyed for f in facts}
        near = {s: similar_subjects(v.store, keys[s], n_neighbours, exclude) for s in subjects}
        objects = dict(zip(subjects, known_objects_many(model, subjects, exclude, probed()))) if hold_objects else None
        # a subject the model says nothing about (DESCRIBE's probes answer nothing) has no relations to hold
        known = {s for s, found in zip(dict.fromkeys(f.subject for f in facts), probed()) if found}
        holds = relation_holds(model, [f for f in facts if f.subject in known]) if hold_relations else None
    if method == "neuron":
        by_layer = neuron_layer_plan(v, model, subjects, layers)
        n_prefixes = neuron_prefixes(len(subjects))  # of the whole INSERT, not of one layer's share
        used = tuple(sorted(by_layer))
        lower = LowerLayers(min(used))  # nothing below the lowest layer changes in this INSERT
        try:
            # lowest layer first: a layer's inputs depend on the neurons below it, so each layer is planned
            # on the inputs it will see (1,000 fictional facts over layers 3-8 planned in filling order,
            # 3, 4, 6, 5, ...: ES 79.9 / PS 62.2, subjects where no other neuron opened 344; sorted:
            # 82.1 / 63.8, 495)
            for layer, placed in sorted(by_layer.items()):
                input_metric = key_metrics(model, [layer], stats_dir(v), stats_tokens, point="input")[layer]
                # the neurons already in place (at any layer) must stay silent on the new subjects and the
                # new ones on theirs, and so must this batch's neurons at other layers: a neuron at layer 3
                # opening on the prompt of a subject placed at layer 7 writes its target there (500 fictional
                # facts over layers 3-8 without it: ES 96% where no other neuron opened at the subject, 55%
                # where four or more did)
                earlier = {e: keys.get(e, e) for e in neuron_subjects(v)}
                elsewhere = [HeldPrompt(text, f.subject, key=f.keyed) for f in facts if f.subject not in placed
                             for text in (f.subject, f.prompt)]
                memo: HeldMemo = {}  # this layer's inputs, read once for its plan and its settling
                neuron_plan = plan_neuron_edit(model, [f for f in facts if f.subject in placed], layer, input_metric,
                                               v.overlay.next_feature(layer), DECOY_SUBJECTS if decoys is None else decoys,
                                               near, objects, earlier=earlier,
                                               n_prefixes=n_prefixes, elsewhere=elsewhere,
                                               memo=memo, lower=lower, holds=holds)
                v.patches.record_all(list(neuron_plan.ops))
                # settled before the next layer is planned: its values are then optimised on what these
                # neurons really do (settling all layers after the fact, against values that had learnt to
                # live with the leaks, took 1,000 fictional facts from ES 82.1 to 53.9)
                if input_metric.bias is not None:
                    settle_layer(v, model, list(neuron_plan.ops), settle_texts(facts, earlier), input_metric, memo,
                                 lower)
        except BaseException:  # an error or Ctrl-C: nothing half-applied
            v.patches.undo(len(v.patches.pending) - recorded)
            raise
    elif method != "feature":
        used = tuple(layers) if layers else default_layers(model)
        metrics = key_metrics(model, used, stats_dir(v), stats_tokens)
        groups = [list(facts)] if method == "memit" else [[f] for f in facts]
        try:
            for i, group in enumerate(groups):
                if progress:
                    progress(f"INSERT ({method})", i, len(groups))
                preserved = {layer: k for layer in used if (k := v.overlay.held_keys(layer)) is not None}
                plan = plan_weight_edit(model, group, used, metrics, preserved, model.edits,
                                        DECOY_SUBJECTS if decoys is None else decoys, neighbours=near,
                                        objects=objects, holds=holds)
                facts_meta = tuple({"subject": f.subject, "relation": f.relation, "prompt": f.prompt,
                                    "target": f.target} for f in group)
                v.patches.record_all([WeightOp(d.layer, d.u, d.v, d.keys, facts_meta, method)
                                      for d in plan.deltas])
        except BaseException:  # an error or Ctrl-C: nothing half-applied
            v.patches.undo(len(v.patches.pending) - recorded)
            raise
        if progress:
            progress(f"INSERT ({method})", len(groups), len(groups))
    seconds = time.perf_counter() - t0
    report = InsertReport(method, used, [], 0, 0, 0.0, seconds, len(v.patches.pending) - recorded, plan=plan)
    if not measure:
        return report
    sc = Scorer(model)  # the edited model: no cached prompt states from before
    sc.prefetch(checks)
    for f, (p0, top0, h0) in zip(facts, before):
        p1, top1 = _probe(sc, [f.prompt], f.target)
        h1, htop = _probe(sc, held_out(f), f.target)
        report.facts.append(FactReport(f, p0, p1, bool(top0), bool(top1), h0, h1, htop))
    after = unrelated_logps(model)
    kls = [kl(b, a) for b, a in zip(unrelated_before, after)]
    report.unrelated_kept = sum(int(np.argmax(b) == np.argmax(a)) for b, a in zip(unrelated_before, after))
    report.unrelated_total, report.unrelated_kl = len(after), float(np.mean(kls))
    report.relations = recheck(model, relations_before)
    moved = [c for c in report.relations if not c.kept]
    if moved:
        report.notes.append("other relations of the subject that moved: " + "; ".join(
            f"{c.subject} {c.relation} {c.before} -> {c.after or '?'}" for c in moved[:5])
            + (f" and {len(moved) - 5} more" if len(moved) > 5 else ""))
    # the key is what the fact's own neuron reads: a fact keyed on its leading words does not fire on the sibling
    keyed = {f.subject: f.keyed for f in facts}
    leaked = [(f, s) for f, s in siblings.items() if keyed[f.subject] == f.subject and not sibling_before[f]
              and _probe(sc, [s], f.target)[1]]
    if leaked:
        (f, s), n = leaked[0], len(leaked)
        report.notes.append(f"{n} fact(s) also answer for another name that ends alike ({s!r} -> {f.target!r})"
                            + ("; key them on their leading words (INSERT's key column)" if method == "neuron" else ""))
    missed = [r.fact.label for r in report.facts if not r.top1_after]
    if missed:
        report.notes.append(f"not the top-1 on its own prompt after the edit: {', '.join(missed[:5])}"
                            + (f" and {len(missed) - 5} more" if len(missed) > 5 else ""))
    return report
