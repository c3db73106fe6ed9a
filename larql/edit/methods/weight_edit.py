"""ROME / MEMIT weight edits, end to end: facts in, low-rank down-projection updates out.

1. Facts are grouped by subject (facts about one subject share its key, so they share one value:
   MEMIT-Merge); each group's value is optimised (`value.py`) at the edit layers.
2. Keys to hold still (dW k = 0): the keys of every edit already made at the layer (so later
   edits leave earlier ones exactly as they were), and "decoys" — the same prompts about other
   subjects (DECOY_SUBJECTS), so that the edit is keyed on the subject rather than on the relation's
   wording ("The capital of France" must not move "The capital of Germany").
3. Per layer, the minimum-C-norm update that maps every new key to its new value (`rome.py`).
ROME is this with one fact at one layer; MEMIT with many facts solved jointly (over one or more
layers). Nothing here touches the model: the caller records the deltas (edit/overlay) and the
model's FFN applies them.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from larql.edit.methods.capture import LowerLayers, capture_batch
from larql.edit.methods.defaults import N_PREFIXES
from larql.edit.methods.facts import Fact, model_prefixes
from larql.edit.methods.relations import known_edges
from larql.edit.methods.rome import KeyMetric, solve_update
from larql.edit.methods.value import ValueResult, optimise_values
from larql.edit.patches.delta import LowRankDelta
from larql.errors import EditError
from larql.model.forward import norm
from larql.model.grad import DenseLayer
from larql.model.model import Model
from larql.model.targets import subject_position
from larql.vindex.tokens import Edge

if TYPE_CHECKING:
    from larql.model.ffn import FFNEdits

F32 = NDArray[np.float32]
# Subjects whose keys the edit must not move, substituted for the fact's subject in its prompt.
# None of them is a subject of benchmarks/data (the benchmark drops any that its held-out prompts use).
DECOY_SUBJECTS = ("Sweden", "Peru", "Greece", "Vietnam", "Argentina", "Austria", "Denmark", "Morocco",
                  "Nigeria", "Thailand", "Ukraine", "Cuba", "Finland", "Chile", "Hungary", "Iceland", "Nepal",
                  "Belgium", "Turkey", "Iran", "Pakistan", "Ghana", "Malaysia", "Switzerland", "Israel",
                  "New Zealand", "the Netherlands", "Chicago", "Sydney", "Vienna", "Seoul", "Istanbul",
                  "Picasso", "Newton", "Darwin", "Beethoven", "Dickens", "Napoleon", "Microsoft", "Toyota",
                  "the river", "my neighbour", "the company", "the city", "the island", "the moon", "music",
                  "football")
MAX_DECOY_PROMPTS = 64
# neighbour prompts held per solve, shared by its facts (ffn has 2048 dims). METHOD NEURON, which holds
# each subject's own: every near input held at 0 beside one at 1 makes g longer, and the neuron fires
# more on ordinary text (40 CounterFact subjects at gemma3-270m's layer 3, held-out corpus tokens:
# mean |g·x| 0.083 / 0.114 / 0.176 with 6 / 12 / 32 neighbours each; 40 in one INSERT with 32 each
# kept 54.2% of unrelated top-1s against 66.7% with this budget's 12)
NEIGHBOUR_BUDGET = 512
VALUE_BATCH = 32  # subjects optimised side by side
OLD_OBJECT_TEMPLATES = ("{} is a", "{} is the", "I live in {}")


@dataclass(frozen=True)
class WeightEditPlan:
    facts: tuple[Fact, ...]
    layers: tuple[int, ...]
    deltas: tuple[LowRankDelta, ...]  # one per layer
    keys: dict[int, F32]  # layer -> (ffn, n_subjects): the keys this edit maps (hold them in later edits)
    values: tuple[ValueResult, ...]  # one per subject group
    decoy_prompts: int
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)


class DenseLayers:
    """Float32 copies of a model's layers for the value step's backward pass, made once per model;
    a layer whose FFN is edited gets its effective matrices (overrides, deletions, down delta, and
    added features after the base ones: gate / up `(ffn + n, hidden)`, down `(hidden, ffn + n)`)."""

    def __init__(self, model: Model) -> None:
        # the layers' weights, not the model: `_dense` maps a model weakly to this, and a value that
        # held its key would keep every dropped editing session's model (and these copies) for good
        self.layers = model.weights.layers
        self._base: dict[int, DenseLayer] = {}

    def __call__(self, layer: int, edits: FFNEdits | None = None) -> DenseLayer:
        if layer not in self._base:
            self._base[layer] = DenseLayer.of(self.layers[layer])
        base = self._base[layer]
        if edits is None:
            return base
        overrides, gone, delta = edits.feature_overrides(layer), edits.deleted(layer), edits.down_delta(layer)
        more = edits.added(layer)
        if not overrides and not gone and delta is None and more is None:
            return base
        gate, up, down = base.gate.copy(), base.up.copy(), base.down.copy()
        for f, (g, u, d) in overrides.items():
            if g is not None:
                gate[f] = g
            if u is not None:
                up[f] = u
            if d is not None:
                down[:, f] = d
        if gone:
            down[:, sorted(gone)] = 0.0  # a deleted feature's activation is zeroed: it writes nothing
        if delta is not None:
            down += delta[0] @ delta[1].T
        if more is not None:  # added features: the layer as the FFN one feature wider per addition
            gate, up, down = np.vstack([gate, more[0]]), np.vstack([up, more[1]]), np.hstack([down, more[2]])
        return replace(base, gate=gate, up=up, down=down)


_dense: weakref.WeakKeyDictionary[Model, DenseLayers] = weakref.WeakKeyDictionary()


def dense_layers(model: Model) -> DenseLayers:
    if model not in _dense:
        _dense[model] = DenseLayers(model)
    return _dense[model]


def group_by_subject(facts: Sequence[Fact]) -> list[list[Fact]]:
    groups: dict[str, list[Fact]] = {}
    for f in facts:
        groups.setdefault(f.subject, []).append(f)
    return list(groups.values())


@dataclass(frozen=True)
class HeldPrompt:
    """A text whose key at `word`'s last token an edit must leave alone; `owner` is the subject it
    is held for (a neighbour's or a known object's prompt), None when held for every subject."""

    text: str
    word: str
    owner: str | None = None
    key: str | None = None  # the word's leading words to take the key at (`defaults.subject_keys`)


def held_prompts(facts: Sequence[Fact], decoys: Sequence[str], limit: int = MAX_DECOY_PROMPTS,
                 neighbours: Mapping[str, Sequence[str]] | None = None,
                 objects: Mapping[str, Sequence[str]] | None = None,
                 per_fact: int | None = None) -> list[HeldPrompt]:
    """Decoy subjects put in the facts' prompts (at most `limit`, for every subject), each subject's
    `neighbours` (edit/methods/neighbours.py, `per_fact` of them: default a NEIGHBOUR_BUDGET shared by the
    facts) put in that subject's prompts, and where the old objects (`target_true`) and each
    subject's `objects` (`known_objects_many`) open a text."""
    subjects = {f.subject.lower() for f in facts}
    # a keyed subject's template keeps the rest ("{} Pharma was founded by"): the decoy is held where the key is
    templates = list(dict.fromkeys(f.prompt.replace(f.keyed, "{}", 1) for f in facts))
    prompts = [HeldPrompt(t.format(d), d) for d in decoys if d.lower() not in subjects for t in templates]
    if len(prompts) > limit:  # spread the budget over templates and decoys alike
        idx = np.linspace(0, len(prompts) - 1, limit).round().astype(int)
        prompts = [prompts[i] for i in idx]
    if neighbours:
        per_fact = per_fact or max(2, NEIGHBOUR_BUDGET // len(facts))  # a large batch holds fewer per fact
        for f in facts:
            near = [n for n in neighbours.get(f.subject, ()) if n.lower() not in subjects][:per_fact]
            prompts += [HeldPrompt(f.prompt.replace(f.keyed, n, 1), n, f.subject) for n in near]
    # what the model knows about the old object ("Paris is the capital of") must not move either,
    # nor what the model says the subject relates to (never a new target)
    targets = {f.target.strip().lower() for f in facts}
    for f in facts:
        olds = [f.target_true.strip()] if f.target_true and f.target_true.strip() else []
        olds += [o for o in (objects or {}).get(f.subject, ()) if o.strip().lower() not in targets]
        prompts += [HeldPrompt(t.format(o), o, f.subject) for o in dict.fromkeys(olds) if o.lower() not in subjects
                    for t in OLD_OBJECT_TEMPLATES]
    return list(dict.fromkeys(prompts))


# held_keys' columns already read, by (point, token ids up to the word) -> {layer: column}
HeldMemo = dict[tuple[str, tuple[int, ...]], dict[int, F32]]


def held_keys(model: Model, prompts: Sequence[HeldPrompt], layers: Sequence[int], point: str = "key",
              memo: HeldMemo | None = None, lower: LowerLayers | None = None,
              ) -> tuple[dict[int, F32], list[str | None]]:
    """Keys `(ffn, n)` per layer at the last token of each prompt's word (with `point="input"`, the
    MLP's normalised inputs `(hidden, n)` there instead), one per distinct text up to that token, and
    whom each column is held for; the first prompt's BOS is held too. `memo`: columns read before
    from the model as it still is at these layers, read again from there and added to (a caller
    keeps one while nothing below the layers changes: METHOD NEURON's plan and settling of a layer
    read many of the same texts, and a layer's own neurons do not change its input); `lower`: the
    texts' residuals below the layers, kept across them (`capture.LowerLayers`)."""
    runs: dict[tuple[int, ...], tuple[int, str | None]] = {}  # "Barcelona is" and "Barcelona was" share a key
    for p in prompts:
        ids, s = subject_position(model, p.text, p.word, p.key)
        runs.setdefault(tuple(ids[: s + 1]), (s, p.owner))  # causal: nothing after the word matters
    hook = "mlp.hook_post" if point == "key" else "hook_resid_mid"
    names = [f"blocks.{layer}.{hook}" for layer in layers]
    memo = {} if memo is None else memo
    first = next(iter(runs), ())
    bos = first[:1] if len(first) > 1 else None  # position 0 reads the same in every run: one entry

    def known(run: tuple[int, ...]) -> bool:
        return all(layer in memo.get((point, run), {}) for layer in layers)

    todo = [r for r in runs if not known(r) or (r == first and bos is not None and not known(bos))]
    for run, seen in zip(todo, capture_batch(model, todo, names, lower)):
        if point == "input":
            seen = {name: norm(model.config, seen[name], model.weights.layers[layer].ffn_norm)
                    for layer, name in zip(layers, names)}
        memo.setdefault((point, run), {}).update({layer: seen[name][-1] for layer, name in zip(layers, names)})
        memo.setdefault((point, run[:1]), {}).update({layer: seen[name][0] for layer, name in zip(layers, names)})
    got: dict[int, list[F32]] = {layer: [] for layer in layers}
    owners: list[str | None] = []
    if bos is not None:
        # the first position (BOS, the attention sink) has one large key shared by every prompt:
        # left free, a 1-rank edit moved its MLP output by 66% at layer 3 and flipped unrelated
        # answers ("Bees make" honey -> up), so it is held like a decoy
        owners.append(None)
        for layer in layers:
            got[layer].append(memo[(point, bos)][layer])
    for run, (_, owner) in runs.items():
        owners.append(owner)
        for layer in layers:
            got[layer].append(memo[(point, run)][layer])
    width = model.config.ffn if point == "key" else model.config.hidden
    return {layer: (np.stack(ks, axis=1) if ks else np.zeros((width, 0), np.float32))
            for layer, ks in got.items()}, owners


def decoy_keys(model: Model, facts: Sequence[Fact], layers: Sequence[int], decoys: Sequence[str],
               limit: int = MAX_DECOY_PROMPTS, neighbours: Mapping[str, Sequence[str]] | None = None,
               point: str = "key", objects: Mapping[str, Sequence[str]] | None = None,
               ) -> tuple[dict[int, F32], int]:
    """`held_keys` of `held_prompts` (every column held for every fact) and the number of prompts."""
    prompts = held_prompts(facts, decoys, limit, neighbours, objects)
    return held_keys(model, prompts, layers, point)[0], len(prompts)


def known_objects_many(model: Model, subjects: Sequence[str], exclude: Collection[str] = (),
                       edges: Sequence[Sequence[Edge]] | None = None) -> list[list[str]]:
    """What the model says each subject relates to: DESCRIBE's probe answers (its capital, language,
    continent...), less words in `exclude`, the probes of all subjects batched together. An edit
    about a subject must not fire on these where they open a text: ten stacked capital edits
    (METHOD NEURON) turned "Berlin is a city in" from Germany to "the" through the Germany edit,
    whose subject input "Berlin" shares (g·x = 0.4). `edges`: `known_edges` of `subjects`, read before."""
    low = {w.lower() for w in exclude}
    return [[e.target for e in found if not set(e.target.lower().split()) & low]
            for found in (known_edges(model, subjects) if edges is None else edges)]


def plan_weight_edit(model: Model, facts: Sequence[Fact], layers: Sequence[int], metrics: dict[int, KeyMetric],
                     preserved: dict[int, F32] | None = None, edits: FFNEdits | None = None,
                     decoys: Sequence[str] = DECOY_SUBJECTS, n_prefixes: int = N_PREFIXES,
                     progress: Callable[[str], None] | None = None,
                     neighbours: Mapping[str, Sequence[str]] | None = None,
                     objects: Mapping[str, Sequence[str]] | None = None,
                     holds: Mapping[str, Sequence[str]] | None = None) -> WeightEditPlan:
    """Compute (do not apply) the update of `layers`' down projections that teaches `facts` to
    `model`, whose FFN already carries `edits` (the value step must see earlier edits); `holds`:
    per subject, prompts about its other relations the value leaves as they are."""
    if not facts:
        raise EditError("no facts to edit")
    layers = tuple(sorted(set(layers)))
    for layer in layers:
        if not 0 <= layer < model.config.n_layers:
            raise EditError(f"layer {layer} is out of range (layers 0-{model.config.n_layers - 1})")
        if layer not in metrics:
            raise EditError(f"no key statistics for layer {layer}")
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    prefixes = model_prefixes(model, n_prefixes) if n_prefixes else ()
    t_prefix = time.perf_counter()
    groups = group_by_subject(facts)
    dense = dense_layers(model)

    def ffn_layers(layer: int) -> DenseLayer:
        return dense(layer, edits)

    # every subject's value in one batched optimisation (one tail pass per step for all of them),
    # in slices that bound the memory of the stacked activations and candidate logits
    values: list[ValueResult] = []
    for i in range(0, len(groups), VALUE_BATCH):
        part = groups[i: i + VALUE_BATCH]
        say(f"values {i + 1}-{i + len(part)}/{len(groups)}: {part[0][0].subject}...")
        values += optimise_values(model, part, layers, prefixes, ffn_layers, holds=holds)
    t_value = time.perf_counter()
    decoy, n_decoys = decoy_keys(model, facts, layers, decoys, neighbours=neighbours, objects=objects)
    deltas, keys = [], {}
    for layer in layers:
        k = np.stack([v.keys[layer] for v in values], axis=1)  # (ffn, n_groups)
        r = np.stack([v.deltas[layer] for v in values], axis=1)  # (hidden, n_groups)
        hold = [decoy[layer]]
        if preserved is not None and layer in preserved:
            hold.insert(0, preserved[layer])
        deltas.append(solve_update(metrics[layer], layer, k, r, np.concatenate(hold, axis=1)))
        keys[layer] = deltas[-1].keys
    t_end = time.perf_counter()
    return WeightEditPlan(tuple(facts), layers, tuple(deltas), keys, tuple(values), n_decoys, t_end - t0,
                          {"prefixes": t_prefix - t0, "values": t_value - t_prefix, "solve": t_end - t_value})
