"""INSERT of one or many facts into an editable vindex, by any method, with an honest report.

Methods (each a strategy in edit/methods/strategies.py):
- "neuron"  one new FFN neuron per subject that fires on that subject alone (edit/methods/neuron.py);
- "rome"    one weight edit per fact (facts about one subject share it), solved one after another,
            each holding the earlier ones' keys still;
- "memit"   all facts in one joint solve per layer (EMMET's equality-constrained MEMIT);
- "feature" LARQL's INSERT: one selective FFN feature per fact (edit/methods/feature.py).
`defaults.default_method` is whichever measured best for the model (benchmarks/bench_editing.py; docs/design/edit-defaults.md).

Every INSERT is recorded on the patch stack as a whole or not at all, and reports, per fact,
efficacy (the prompt), generalisation and locality measured on prompts it did NOT optimise on:
the prompt behind model-written prefixes of another seed, the user's paraphrases, and a broad set
of unrelated prompts (top-1 kept, KL).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from larql.edit.measure.evaluate import EVAL_PREFIX_SEED, EVAL_PREFIXES, UNRELATED, Scorer, unrelated_logps
from larql.edit.measure.features import FeatureShift, feature_shift, last_token_features, with_tokens
from larql.edit.methods.defaults import METHODS, N_NEIGHBOURS, default_method
from larql.edit.methods.facts import Fact, model_prefixes
from larql.edit.methods.relations import RelationCheck, known_edges, known_relations, recheck
from larql.edit.methods.strategies import KEY_ON, STRATEGIES, EditRequest
from larql.edit.methods.weight_edit import WeightEditPlan
from larql.edit.state.edited import EditTarget
from larql.errors import EditError
from larql.model.grad import require_backward
from larql.model.interp import kl
from larql.model.sae import SAE
from larql.vindex.tokens import Edge


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
    features: list[FeatureShift] = field(default_factory=list)  # the edit seen through each SAE given

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
                 hold_relations: bool = True, key_on: str = "subject", saes: Sequence[SAE] = ()) -> InsertReport:
    """Teach `facts` to the vindex's model through its overlay (recorded on its patch stack, all or
    nothing) and measure the result on held-out prompts.

    Weight edits hold still the keys of `decoys` and of each subject's `n_neighbours` nearest
    subjects in the embedding, except words in `exclude` (an evaluation's held-out subjects), weighted
    by key statistics over `stats_tokens` tokens (default `stats.token_budget`), and with
    `hold_objects` the keys of what the model says each subject relates to (`known_objects_many`).
    `key_on="query"` keys METHOD NEURON's neurons for subjects the model knows on the fact's question
    (edit/methods/query_neuron.py), on models with a measured query layer. With `saes` (SAEs or
    transcoders that fit the model), the report also reads their features on the edited prompts and on
    the unrelated ones, before and after (`measure/features.py`)."""
    method = method or default_method(v.index["model"])
    if method not in METHODS:
        raise EditError(f"unknown edit method {method!r} (one of {', '.join(METHODS)})")
    if not facts:
        raise EditError("INSERT needs at least one fact")
    if key_on not in KEY_ON:
        raise EditError(f"unknown key_on {key_on!r} (one of {', '.join(KEY_ON)})")
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
        edited_prompts = list(dict.fromkeys(f.prompt for f in facts))
        features_before = (last_token_features(model, saes, edited_prompts),
                           last_token_features(model, saes, UNRELATED)) if saes else None
    recorded = len(v.patches.pending)
    request = EditRequest(v, model, list(facts), method, layers, progress, decoys, n_neighbours, exclude, stats_tokens,
                          hold_objects, hold_relations, probed, key_on)
    try:
        done = STRATEGIES[method](request)
    except BaseException:  # an error or Ctrl-C: nothing half-applied
        v.patches.undo(len(v.patches.pending) - recorded)
        raise
    facts, used, plan = done.facts, done.layers, done.plan
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
    if features_before is not None:
        edited_after = last_token_features(model, saes, edited_prompts)
        unrelated_after = last_token_features(model, saes, UNRELATED)
        report.features = [with_tokens(model, s, feature_shift(
            s.hook_name, features_before[0][s.hook_name], edited_after[s.hook_name],
            features_before[1][s.hook_name], unrelated_after[s.hook_name])) for s in saes]
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
