"""Each edit method as one strategy behind one interface: an `EditRequest` in, the method's patch
operations recorded on the view's stack, a `Recorded` out. INSERT (edit/insert.py) picks the
strategy from `STRATEGIES`, undoes whatever a failing one recorded, and measures the result."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

import numpy as np

from larql.edit.methods.capture import LowerLayers
from larql.edit.methods.defaults import (
    NEURONS_PER_LAYER,
    default_layer,
    neuron_layers,
    neuron_prefixes,
    query_layer,
    subject_keys,
)
from larql.edit.methods.facts import Fact
from larql.edit.methods.metrics import key_metrics, stats_dir
from larql.edit.methods.neighbours import similar_subjects
from larql.edit.methods.neuron import plan_neuron_edit
from larql.edit.methods.neuron_settle import settle_layer, settle_texts
from larql.edit.methods.query_neuron import plan_query_neuron_edit, relation_forms
from larql.edit.methods.relations import relation_holds
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
from larql.model.model import Model
from larql.vindex.tokens import Edge, is_content_token


@dataclass
class EditRequest:
    """One INSERT as a method sees it (insert_facts' arguments, the model, and DESCRIBE's probe edges
    of each subject, read once on first use)."""

    v: EditTarget
    model: Model
    facts: list[Fact]
    method: str
    layers: Sequence[int] | None
    progress: Callable[[str, int, int], None] | None
    decoys: Sequence[str] | None
    n_neighbours: int
    exclude: Collection[str]
    stats_tokens: int | None
    hold_objects: bool
    hold_relations: bool
    probed: Callable[[], list[list[Edge]]]
    key_on: str = "subject"  # METHOD NEURON: "query" keys known subjects' neurons on the fact's question

    @property
    def decoy_subjects(self) -> Sequence[str]:
        return DECOY_SUBJECTS if self.decoys is None else self.decoys


KEY_ON = ("subject", "query")


@dataclass(frozen=True)
class Recorded:
    """What a strategy did: the layers it edited, the facts as it taught them (NEURON fills in each
    fact's key), and a weight edit's last plan."""

    layers: tuple[int, ...]
    facts: list[Fact]
    plan: WeightEditPlan | None = None


@dataclass(frozen=True)
class Holds:
    """What a neuron or weight edit holds still: each subject's nearest subjects and known objects,
    and its other relations' prompts."""

    near: dict[str, list[str]]
    objects: dict[str, list[str]] | None
    relations: dict[str, list[str]] | None  # subject -> prompts about its other relations


def default_layers(model: Model) -> tuple[int, ...]:
    return (default_layer(model.name, model.config.n_layers),)


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


def holds_of(r: EditRequest, subjects: list[str], keys: dict[str, str]) -> Holds:
    """Each subject's nearest subjects (by its key), the objects the model relates it to, and, for
    a subject the model knows something about (DESCRIBE's probes answer), its other relations."""
    near = {s: similar_subjects(r.v.store, keys[s], r.n_neighbours, r.exclude) for s in subjects}
    objects = (dict(zip(subjects, known_objects_many(r.model, subjects, r.exclude, r.probed())))
               if r.hold_objects else None)
    known = {s for s, found in zip(dict.fromkeys(f.subject for f in r.facts), r.probed()) if found}
    relations = relation_holds(r.model, [f for f in r.facts if f.subject in known]) if r.hold_relations else None
    return Holds(near, objects, relations)


def record_feature(r: EditRequest) -> Recorded:
    """METHOD FEATURE: one selective feature per fact, later facts tuned against earlier ones."""
    from larql.edit.methods.feature import plan_insert

    ops = []
    for f in r.facts:
        feature_ops, _ = plan_insert(r.v, f.subject, f.relation or "relation", f.target,
                                     None if r.layers is None else r.layers[0])
        r.v.patches.record_all(list(feature_ops))  # later facts re-tune against earlier ones
        ops += feature_ops
    return Recorded(tuple(sorted({op.layer for op in ops})), r.facts)


def record_neuron(r: EditRequest) -> Recorded:
    """METHOD NEURON: one neuron per subject, keyed on the subject (`record_subject_neurons`); with
    `key_on="query"`, for a subject the model knows something about (`known_subjects`), on a model
    with a measured query layer (or at the one layer given), one neuron per fact keyed on the query
    (`record_query_neurons`)."""
    layer = None
    if r.key_on == "query":
        layer = query_layer(r.model.name) if r.layers is None else r.layers[0] if len(r.layers) == 1 else None
    known = known_subjects(r) if layer is not None else set()
    by_query = [f for f in r.facts if f.subject in known]
    rest = [f for f in r.facts if f.subject not in known]
    done_layers: list[int] = []
    facts: list[Fact] = []
    if rest:
        got = record_subject_neurons(_part(r, rest))
        done_layers += got.layers
        facts += got.facts
    if by_query:
        assert layer is not None
        got = record_query_neurons(_part(r, by_query), layer)
        done_layers += got.layers
        facts += got.facts
    order = {(f.subject, f.prompt, f.target): i for i, f in enumerate(r.facts)}
    return Recorded(tuple(sorted(set(done_layers))), sorted(facts, key=lambda f: order[(f.subject, f.prompt, f.target)]))


# A subject counts as known where DESCRIBE's probes answer, or where the model's top-1 after the fact's
# own prompt is a word at this probability or more (the probes' bar, 0.7, missed subjects whose other
# relations the model still knew: "The currency of Uruguay is the" " Urugu" at 0.19; an invented
# name's prompt answers " a" or " the")
KNOWN_ANSWER_P = 0.15


def known_subjects(r: EditRequest) -> set[str]:
    """The subjects of `r` the model knows something about (see KNOWN_ANSWER_P)."""
    subjects = list(dict.fromkeys(f.subject for f in r.facts))
    known = {s for s, found in zip(subjects, r.probed()) if found}
    ask = [f for f in r.facts if f.subject not in known]
    if ask:
        logits = r.model.next_logits_batch([r.model.tokenize(f.prompt) for f in ask]).astype(np.float64)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        for f, row in zip(ask, p):
            t = int(np.argmax(row))
            if row[t] >= KNOWN_ANSWER_P and is_content_token(r.model.detokenize([t]).strip()):
                known.add(f.subject)
    return known


def _part(r: EditRequest, facts: list[Fact]) -> EditRequest:
    """`r` for some of its facts, its probe edges those of their subjects."""
    if len(facts) == len(r.facts):
        return r
    edges = dict(zip(dict.fromkeys(f.subject for f in r.facts), r.probed()))
    return replace(r, facts=facts, probed=lambda: [edges[s] for s in dict.fromkeys(f.subject for f in facts)])


def record_query_neurons(r: EditRequest, layer: int) -> Recorded:
    """One neuron per fact at `layer`, opened by the fact's question (its subject and relation together)
    at the prompt's last token, so the subject's other relations keep their answers."""
    v, model = r.v, r.model
    subjects = list(dict.fromkeys(f.subject for f in r.facts))
    # the question as DESCRIBE's probe for the relation asks it is learnt too: more phrasings to open on
    facts = [replace(f, prompts=(*f.prompts, *relation_forms(f))) for f in r.facts]
    # the query solve holds no known objects (holding their questions cost locality: the design note), so none are read
    holds = holds_of(replace(r, facts=facts, hold_objects=False), subjects, {s: s for s in subjects})
    metric = key_metrics(model, [layer], stats_dir(v), r.stats_tokens, point="input")[layer]
    plan = plan_query_neuron_edit(model, facts, layer, metric, v.overlay.next_feature(layer), r.decoy_subjects,
                                  holds.near, holds.relations, n_prefixes=neuron_prefixes(len(subjects)),
                                  edited=neuron_subjects(v))
    v.patches.record_all(list(plan.ops))
    return Recorded((layer,), list(r.facts))


def record_subject_neurons(r: EditRequest) -> Recorded:
    """One neuron per subject, layer by layer, each layer settled before the next."""
    v, model = r.v, r.model
    subjects = list(dict.fromkeys(f.subject for f in r.facts))  # probed once per subject, not per fact
    # a neuron keys on what tells its subject from the others, in place and new
    keys = subject_keys([*subjects, *neuron_subjects(v)])
    facts = [f if f.key else replace(f, key=keys[f.subject]) for f in r.facts]
    keys |= {f.subject: f.keyed for f in facts}
    holds = holds_of(replace(r, facts=facts), subjects, keys)
    by_layer = neuron_layer_plan(v, model, subjects, r.layers)
    n_prefixes = neuron_prefixes(len(subjects))  # of the whole INSERT, not of one layer's share
    lower = LowerLayers(min(by_layer))  # nothing below the lowest layer changes in this INSERT
    # lowest layer first: a layer's inputs depend on the neurons below it, so each layer is planned on
    # the inputs it will see
    for layer, placed in sorted(by_layer.items()):
        input_metric = key_metrics(model, [layer], stats_dir(v), r.stats_tokens, point="input")[layer]
        # the neurons already in place (at any layer) must stay silent on the new subjects and the new
        # ones on theirs, and so must this batch's neurons at other layers: a neuron at one layer opening
        # on the prompt of a subject placed at another writes its target there
        earlier = {e: keys.get(e, e) for e in neuron_subjects(v)}
        elsewhere = [HeldPrompt(text, f.subject, key=f.keyed) for f in facts if f.subject not in placed
                     for text in (f.subject, f.prompt)]
        memo: HeldMemo = {}  # this layer's inputs, read once for its plan and its settling
        plan = plan_neuron_edit(model, [f for f in facts if f.subject in placed], layer, input_metric,
                                v.overlay.next_feature(layer), r.decoy_subjects, holds.near, holds.objects,
                                earlier=earlier, n_prefixes=n_prefixes, elsewhere=elsewhere, memo=memo, lower=lower,
                                holds=holds.relations)
        v.patches.record_all(list(plan.ops))
        # settled before the next layer is planned: its values are then optimised on what these neurons
        # really do, not on leaks they had learnt to live with
        if input_metric.bias is not None:
            settle_layer(v, model, list(plan.ops), settle_texts(facts, earlier), input_metric, memo, lower)
    return Recorded(tuple(sorted(by_layer)), facts)


def record_weights(r: EditRequest) -> Recorded:
    """METHOD ROME (a solve per fact, one after another) and MEMIT (one joint solve per layer), each
    holding the keys earlier weight edits at the layer map."""
    v, model = r.v, r.model
    subjects = list(dict.fromkeys(f.subject for f in r.facts))
    holds = holds_of(r, subjects, {s: s for s in subjects})
    used = tuple(r.layers) if r.layers else default_layers(model)
    metrics = key_metrics(model, used, stats_dir(v), r.stats_tokens)
    groups = [list(r.facts)] if r.method == "memit" else [[f] for f in r.facts]
    plan = None
    for i, group in enumerate(groups):
        if r.progress:
            r.progress(f"INSERT ({r.method})", i, len(groups))
        preserved = {layer: k for layer in used if (k := v.overlay.held_keys(layer)) is not None}
        plan = plan_weight_edit(model, group, used, metrics, preserved, model.edits, r.decoy_subjects,
                                neighbours=holds.near, objects=holds.objects, holds=holds.relations)
        facts_meta = tuple({"subject": f.subject, "relation": f.relation, "prompt": f.prompt, "target": f.target}
                           for f in group)
        v.patches.record_all([WeightOp(d.layer, d.u, d.v, d.keys, facts_meta, r.method) for d in plan.deltas])
    if r.progress:
        r.progress(f"INSERT ({r.method})", len(groups), len(groups))
    return Recorded(used, r.facts, plan)


STRATEGIES: dict[str, Callable[[EditRequest], Recorded]] = {
    "feature": record_feature, "neuron": record_neuron, "rome": record_weights, "memit": record_weights}
