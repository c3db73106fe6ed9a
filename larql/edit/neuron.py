"""METHOD NEURON: each subject's facts become one FFN neuron that fires on that subject alone.

Why not only ROME: a rank-one change of the down projection, dW = u vᵀ, adds u (v·k) at *every*
token, linearly in the key k; ROME's v is the best linear choice, and still, on gemma3-270m's
layer 3, v·k has an rms of 0.03-0.05 on ordinary text (held-out corpus tokens) against 1 at the
subject — times a value of norm 10-30, and ten such edits flip unrelated answers ("Berlin is a city
in" Germany -> the). A neuron is quadratic where ROME is linear: with gate = a g and up = g,

    act(x) = f(a g·x) (g·x)        (f: the model's GELU / SiLU; x: the MLP's normalised input)

is f(a) at the subject (g·x* = 1) and about (g·x)² elsewhere, so what ROME leaks as ε a neuron
leaks as ~ε². Measured on the same layer, ten capital subjects: rms 0.002-0.02 on held-out corpus
tokens (ROME 0.03-0.05), cross-talk to the other nine subjects 0.02-0.1 (ROME 0.17-0.50), and the
same reach to paraphrases (0.75-1.04 of the subject's activation; ROME 0.82-1.22).

The install, per subject (facts about one subject share a neuron):
- value u: the optimised change of the MLP output at the subject's last token (value.py, as ROME);
- direction g: the smallest g in Σ's norm (Σ = E[x xᵀ] over the statistics corpus, `stats.py`
  point "input") with g·x = 1 at the subject's mean input x* and where the subject opens the text
  (BOS + subject: "Peru's capital city is"; never at position 0, the attention sink of a model
  that puts no BOS first), and g·x = 0 at decoys, nearest
  subjects, BOS, the batch's other subjects and the subjects of neurons already at the layer
  (the same constrained solve as ROME's, `rome.solve_update`, in the input space);
- slot: the feature that carries least on ordinary text, sqrt(E[k_f²]) |down_f| (on gemma3-270m's
  layer 3 the cheapest are ~0.014-0.02 against an MLP output norm of ~6), not already edited;
- down = (u + k*_f down_f) / f(a): the slot's own contribution at the subject is given back, so the
  subject's MLP output changes by exactly u at its mean input.
The result is ordinary feature inserts (PatchOp "insert"): patches, SHOW PATCHES, COMPILE carry it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from larql.edit.capture import capture
from larql.edit.facts import Fact, model_prefixes, subject_position
from larql.edit.feature_insert import target_direction
from larql.edit.methods import N_PREFIXES
from larql.edit.overlay import MetaOverride
from larql.edit.patch import NEURON_REASON, PatchOp
from larql.edit.rome import KeyMetric, solve_update
from larql.edit.value import ValueResult, optimise_values
from larql.edit.weight_edit import VALUE_BATCH, decoy_keys, dense_layers, group_by_subject
from larql.errors import EditError
from larql.model.ffn import gated
from larql.model.forward import norm
from larql.model.grad import DenseLayer
from larql.model.interp import first_target_token
from larql.model.model import Model

F32 = NDArray[np.float32]
PRE_ACTIVATION = 12.0  # a: the gate's pre-activation at the subject, deep in GELU's / SiLU's linear part


@dataclass(frozen=True)
class NeuronPlan:
    facts: tuple[Fact, ...]
    layer: int
    ops: tuple[PatchOp, ...]  # one "insert" per subject
    slots: tuple[int, ...]
    values: tuple[ValueResult, ...]
    decoy_prompts: int
    seconds: float


def slot_costs(key_moment_diag: NDArray[np.float64], down: F32) -> NDArray[np.float64]:
    """What each feature writes on ordinary text: rms activation x norm of its down column `(ffn,)`."""
    return np.sqrt(np.maximum(key_moment_diag, 0.0)) * np.linalg.norm(down, axis=0)


def free_slots(costs: NDArray[np.float64], taken: Set[int], n: int) -> list[int]:
    """The `n` cheapest features not in `taken`."""
    order = [int(f) for f in np.argsort(costs, kind="stable") if int(f) not in taken]
    if len(order) < n:
        raise EditError(f"the layer has {len(order)} features left to turn into neurons, {n} asked for")
    return order[:n]


def subject_input(model: Model, layer: int, subject: str) -> F32 | None:
    """The MLP's normalised input `(hidden,)` at the subject's last token, the subject opening the
    text; None when that token would be the text's first (a model without BOS, a one-token subject):
    position 0 is the attention sink, whose input is nearly the same for every token, and a neuron
    asked to fire there fired on a fifth of all tokens (SmolLM2-135M: 35 neurons in one INSERT kept
    4.2% of unrelated top-1s)."""
    ids, s = subject_position(model, subject, subject)
    if s == 0:
        return None
    name = f"blocks.{layer}.hook_resid_mid"
    resid = capture(model, ids[: s + 1], [name])[name]
    return norm(model.config, resid[s: s + 1], model.weights.layers[layer].ffn_norm)[0]


def plan_neuron_edit(model: Model, facts: Sequence[Fact], layer: int, key_metric: KeyMetric,
                     input_metric: KeyMetric, taken: Set[int], decoys: Sequence[str],
                     neighbours: Mapping[str, Sequence[str]] | None = None,
                     objects: Mapping[str, Sequence[str]] | None = None,
                     n_prefixes: int = N_PREFIXES) -> NeuronPlan:
    """Compute (do not apply) one neuron per subject of `facts` at `layer` of `model` (whose FFN
    already carries the vindex's edits). `taken`: features already edited at the layer; `decoys`:
    subjects whose inputs the neurons must not fire on (besides the nearest subjects in `neighbours`
    and the subjects' known `objects`)."""
    if not facts:
        raise EditError("no facts to edit")
    if not 0 <= layer < model.config.n_layers:
        raise EditError(f"layer {layer} is out of range (layers 0-{model.config.n_layers - 1})")
    t0 = time.perf_counter()
    prefixes = model_prefixes(model, n_prefixes) if n_prefixes else ()
    groups = group_by_subject(facts)
    dense = dense_layers(model)
    edits = model.edits

    def ffn_layers(i: int) -> DenseLayer:
        return dense(i, edits)

    values: list[ValueResult] = []
    for i in range(0, len(groups), VALUE_BATCH):
        values += optimise_values(model, groups[i: i + VALUE_BATCH], [layer], prefixes, ffn_layers)
    held, n_decoys = decoy_keys(model, facts, [layer], decoys, neighbours=neighbours, point="input",
                                 objects=objects)
    down = dense(layer, edits).down  # (hidden, ffn): the layer as edited so far
    slots = free_slots(slot_costs(key_metric.diag, down), taken, len(groups))
    f_a = float(gated(model.config.activation, np.array([[PRE_ACTIVATION]], np.float32),
                      np.array([[1.0]], np.float32))[0, 0])  # act at the subject, where g·x = 1
    inputs = np.stack([v.inputs[layer] for v in values], axis=1)  # (hidden, n_groups)
    ops = []
    for j, (group, value, slot) in enumerate(zip(groups, values, slots)):
        others = np.delete(inputs, j, axis=1)
        # fire fully at the subject's mean input and where it opens the text ("Peru's capital is":
        # there its input is another, and g·x was 0.4 when only the mean was asked for)
        start = subject_input(model, layer, group[0].subject)
        fire = np.stack([inputs[:, j]] + ([] if start is None else [start]), axis=1)
        g = solve_update(input_metric, layer, fire, np.zeros((1, fire.shape[1]), np.float32),
                         np.concatenate([held[layer], others], axis=1)).v.sum(axis=1)  # (hidden,) g·x = 1 at each
        old = float(value.keys[layer][slot]) * down[:, slot]  # what the slot wrote at the subject
        new_down = ((value.deltas[layer] + old) / f_a).astype(np.float32)
        fact = group[0]
        tid = first_target_token(model, fact.target)
        score = float(target_direction(model, layer, tid) @ new_down / np.linalg.norm(new_down))
        meta = MetaOverride((tid,), (round(score, 4),))  # down_meta: cos(down, the target's direction)
        ops.append(PatchOp("insert", layer, slot, {"gate": (PRE_ACTIVATION * g).astype(np.float32),
                                                    "up": g.astype(np.float32), "down": new_down},
                           meta, fact.subject, fact.relation or "relation", fact.target,
                           reason=NEURON_REASON + "; ".join(f.label for f in group)))
    return NeuronPlan(tuple(facts), layer, tuple(ops), tuple(slots), tuple(values), n_decoys,
                      time.perf_counter() - t0)

