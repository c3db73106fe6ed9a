"""METHOD NEURON: each subject's facts become one FFN neuron that fires on that subject alone.

Why not only ROME: a rank-one change of the down projection, dW = u vᵀ, adds u (v·k) at *every*
token, linearly in the key k; ROME's v is the best linear choice, and still, on gemma3-270m's
layer 3, v·k has an rms of 0.03-0.05 on ordinary text (held-out corpus tokens) against 1 at the
subject — times a value of norm 10-30, and ten such edits flip unrelated answers ("Berlin is a city
in" Germany -> the). A neuron is a threshold where ROME is linear: with up = g, z = g·x (x: the
MLP's normalised input, z = 1 at the subject) and c a bias direction (c·x ≈ 1 on every token,
`bias_direction`),

    act(x) = f(a (z - θ c·x)) z        (f: the model's GELU / SiLU; a (1 - θ) = PRE_ACTIVATION)

is f(a(1 - θ)) at the subject and ~0 wherever z < θ: the gate is shut (at z = 0, f(-a θ) = f(-12)). Without a bias
direction it is f(a z) z, quadratic, ~(g·x)² off the subject. docs/design/neuron-edits.md has the
measurements behind each choice here.

The install, per subject (facts about one subject share a neuron):
- value u: the optimised change of the MLP output at the subject's last token (value.py, as ROME);
- direction g: the smallest g in Σ's norm (Σ = E[x xᵀ] over the statistics corpus, `stats.py`
  point "input") with g·x = 1 at the subject's mean input x* and where the subject opens the text
  (BOS + subject: "Peru's capital city is"; never at position 0, the attention sink of a model
  that puts no BOS first), and g·x = 0 at BOS, decoys, its subject's nearest subjects and known
  objects, and — where the threshold is missing — the other subjects (of the batch, of neurons
  already at the layer) nearest to it; and wherever else it would fire (g·x > 0.6 with the threshold,
  > 0.05 without; `neuron_directions`: ROME's constrained solve, in the input space, each neuron
  with its own constraints);
- an added feature: the neuron is appended to the layer (ids from the layer's base width up), so
  no feature of the model is given up (taking over the layer's cheapest feature cost most of the
  locality at hundreds of edits);
- down = u / f(a): the subject's MLP output changes by exactly u at its mean input.
Once a layer's neurons are recorded they are settled (neuron_settle.py): re-read on every subject's
texts through the edited model, a neuron that opens on another subject's is held there.
The result is feature inserts (PatchOp "insert") at the added ids: patches, SHOW PATCHES, COMPILE
(a layer written that many features wider) carry it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from larql.edit.methods.capture import LowerLayers, capture_batch
from larql.edit.methods.defaults import N_PREFIXES
from larql.edit.methods.facts import Fact, model_prefixes
from larql.edit.methods.feature import target_direction
from larql.edit.methods.rome import CONSTRAINT_RIDGE, KeyMetric
from larql.edit.methods.value import ValueResult, optimise_values
from larql.edit.methods.weight_edit import (
    VALUE_BATCH,
    HeldMemo,
    HeldPrompt,
    dense_layers,
    group_by_subject,
    held_keys,
    held_prompts,
)
from larql.edit.patches.overlay import MetaOverride
from larql.edit.patches.patch import NEURON_REASON, PatchOp
from larql.errors import EditError
from larql.model.ffn import gated
from larql.model.forward import norm
from larql.model.grad import DenseLayer
from larql.model.model import Model
from larql.model.targets import first_target_token, subject_position

F32 = NDArray[np.float32]
PRE_ACTIVATION = 12.0  # a: the gate's pre-activation at the subject, deep in GELU's / SiLU's linear part
# With a bias direction the gate opens only where g·x passes THRESHOLD (1 at the subject). Higher is
# more local and less forgiving: a paraphrase whose g·x is z gets (z - θ) z / (1 - θ) of the value.
# 0.5 reached far more paraphrases than 0.7 for a little locality; both bundled models use it
# (docs/design/edit-defaults.md has the measurements)
THRESHOLD = 0.5


@dataclass(frozen=True)
class NeuronPlan:
    facts: tuple[Fact, ...]
    layer: int
    ops: tuple[PatchOp, ...]  # one "insert" per subject
    features: tuple[int, ...]  # the added features' ids
    values: tuple[ValueResult, ...]
    decoy_prompts: int
    seconds: float


# Where else a neuron fires fully: the subject opening a text ("Peru's capital is": there its input
# is another than at the mean over the prompts). Not behind other words ("In {}", "of {}"): made-up
# names share their last tokens ("-stan", "-ia"), and behind a common word that token's input is
# mostly the token's own, shared with the other subjects, so neurons opened on each other's subjects
FIRE_CONTEXTS = ("{}",)


def subject_inputs(model: Model, layer: int, subjects: Sequence[str],
                   contexts: Sequence[str] = FIRE_CONTEXTS, keys: Mapping[str, str] | None = None,
                   texts: Mapping[str, Sequence[str]] | None = None, lower: LowerLayers | None = None) -> list[F32]:
    """The MLP's normalised inputs `(hidden, n)` at each subject's last token (its key's, where `keys`
    names one) in each of `contexts` (texts opening with them) and of its own `texts` (which contain
    it), less any where that token would be the text's first (a model without BOS, a one-token
    subject opening the text): position 0 is the attention sink, whose input is nearly the same for
    every token, and a neuron asked to fire there fired on a fifth of all tokens (SmolLM2-135M: 35
    neurons in one INSERT kept 4.2% of unrelated top-1s)."""
    name = f"blocks.{layer}.hook_resid_mid"
    at = [[subject_position(model, t, s, (keys or {}).get(s))
           for t in [*(c.format(s) for c in contexts), *(texts or {}).get(s, ())]] for s in subjects]
    runs = [ids[: s + 1] for row in at for ids, s in row if s > 0]
    seen = iter(capture_batch(model, runs, [name], lower) if runs else [])
    out: list[F32] = []
    for row in at:
        cols = [next(seen)[name][s] for _, s in row if s > 0]
        x = np.stack(cols) if cols else np.zeros((0, model.config.hidden), np.float32)
        out.append(norm(model.config, x, model.weights.layers[layer].ffn_norm).T if cols else x.T)
    return out


BIAS_SPREAD = 0.1  # a bias direction is used where c·x varies by less than this on ordinary text


def bias_direction(cov: NDArray[np.float64], mean: NDArray[np.float64]) -> F32 | None:
    """The FFN has no bias, but its normalised inputs x share a large common part: c, the least-squares
    fit of c·x = 1 over the statistics corpus (c = Σ⁻¹μ rescaled so that E[c·x] = 1; Σ = E[xxᵀ],
    μ = E[x]), stands in for one where c·x's spread on that text, sqrt(cᵀΣc - 1), is under
    BIAS_SPREAD (gemma3-270m layers 3 / 4 / 6: 0.041 / 0.035 / 0.021 on held-out corpus tokens);
    else None."""
    d = len(mean)
    c = np.linalg.solve(cov + 1e-6 * float(np.mean(np.diag(cov))) * np.eye(d), mean)
    fit = float(mean @ c)
    if not fit > 0:
        return None
    c /= fit
    spread = float(np.sqrt(max(float(c @ cov @ c) - 1.0, 0.0)))
    return c.astype(np.float32) if spread < BIAS_SPREAD else None


# How each neuron is held (`neuron_directions`): the batch's other subjects nearest it in Σ's metric
# held at 0 from the start, and |g·x| above which any other held or subject input is held too, in
# further solves. A quadratic neuron leaks (g·x)² wherever g·x is not 0, so it holds much; a thresholded
# one only needs g·x under θ, and every hold lengthens g (100 fictional subjects at layer 3, θ = 0.5:
# 48 nearest and 0.05, ES 55 / PS 21.5 / 13 of 24 unrelated top-1s kept; 16 and 0.25, 58 / 35.5 / 18;
# none and 0.3, 82 / 53 / 20; none and 0.6 — these — 98 / 65 / 22 (KL 0.13); θ = 0.65, none and
# 0.45, 92 / 61 / 24; θ = 0.7, none and 0.6, 98 / 64.5 / 24 (KL 0.003), θ = 0.8 the same; θ = 0.65
# without any leak solve, 97 / 64 / 24)
NEAR_OTHERS, LEAK = 48, 0.05  # quadratic
THRESHOLD_NEAR_OTHERS, THRESHOLD_LEAK = 0, 0.6
SOLVE_ROUNDS = 3
MAX_CONSTRAINTS = 0.75  # of the input's dimensions: a solve over more would be least squares, not exact
# A thresholded neuron holds only where g·x > THRESHOLD_LEAK (below -θ its gate is shut: holding those
# spent the constraints for nothing), the worst THRESHOLD_PER_ROUND a solve, for up to
# THRESHOLD_ROUNDS solves, and keeps the last g whose rms on ordinary text, sqrt(gᵀΣg), is under
# THRESHOLD_RMS (a longer g opens on ordinary tokens). On gemma3-270m's layer 3, 167 of the 1,000
# fictional subjects with the other 833's inputs there as candidates (paraphrases held out; "opens":
# g·x > 0.65): held-out paraphrases of other subjects opening a neuron 5.3 per neuron with |g·x| and
# 3 rounds (the neurons of one layer only), 3.5 with these; held-out corpus tokens opening any neuron
# 1.9% and 2.4%; without the rms bound 0.01 and 12.7%, with 0.15 6.7 and 0.2%.
THRESHOLD_ROUNDS, THRESHOLD_PER_ROUND, THRESHOLD_RMS = 6, 32, 0.2


def neuron_directions(metric: KeyMetric, fire: Sequence[F32], held: F32, owners: Sequence[int],
                      candidates: F32 | None = None, near_others: int = NEAR_OTHERS, leak_above: float = LEAK,
                      thresholded: bool = False) -> list[F32]:
    """One direction g per neuron j, `(hidden,)`: the smallest in Σ's norm with g·x = 1 at each column
    of `fire[j]` `(hidden, n_j)`, and g·x = 0 at the `held` columns `(hidden, H)` whose owner is j or
    -1 (every neuron's), at the `near_others` inputs nearest to its own among the other neurons' fire
    columns and the `candidates` `(hidden, C)` (subjects of other neurons, this layer's or others'),
    and at any column where g·x would otherwise exceed `leak_above` (|g·x| for a quadratic neuron; at
    most SOLVE_ROUNDS solves, the worst first, while the constraints stay under MAX_CONSTRAINTS of
    the dimensions; a `thresholded` neuron's rounds are bounded as THRESHOLD_ROUNDS' comment says).

    Holding every other subject of a large batch at 0 would ask for more constraints than the input
    has dimensions (gemma3-270m: 640) and the solve would return a huge g that fires everywhere (100
    fictional subjects in one INSERT kept 25% of unrelated top-1s); a neuron is quadratic, (g·x)² off
    its subject, so the inputs that matter are the near ones and the ones it would fire on."""
    cand = candidates if candidates is not None else np.zeros((held.shape[0], 0), np.float32)
    x = np.concatenate([*fire, held, cand], axis=1).astype(np.float64)  # (hidden, N)
    n_fire = sum(f.shape[1] for f in fire)
    fire_of = np.concatenate([np.full(f.shape[1], j) for j, f in enumerate(fire)]
                             + [np.full(held.shape[1] + cand.shape[1], -2)]).astype(np.int64)
    own = np.concatenate([np.full(n_fire, -2), np.asarray(owners, np.int64), np.full(cand.shape[1], -3)])
    pool = np.flatnonzero((fire_of >= 0) | (own == -3))  # held only when near or leaking
    cinv_x = metric.solve(x)  # (hidden, N)
    norms = np.sqrt(np.maximum(np.einsum("ij,ij->j", x, cinv_x), 1e-30))  # (N,)
    rounds, per_round = (THRESHOLD_ROUNDS, THRESHOLD_PER_ROUND) if thresholded else (SOLVE_ROUNDS, len(own))
    out = []
    for j in range(len(fire)):
        mine = np.flatnonzero(fire_of == j)
        others = pool[fire_of[pool] != j]
        nearest = others[:0]
        if near_others:  # a thresholded neuron holds none up front: skip the (N, n_j) product
            cos = np.abs(x[:, others].T @ cinv_x[:, mine]).max(axis=1) / norms[others] / norms[mine].min()
            nearest = others[np.argsort(-cos)[:near_others]]
        cols = np.unique(np.concatenate([mine, np.flatnonzero((own == -1) | (own == j)), nearest]))
        g = None
        for _ in range(rounds):
            g_sub = x[:, cols].T @ cinv_x[:, cols]  # (m, m)
            g_sub += CONSTRAINT_RIDGE * float(np.mean(np.diag(g_sub))) * np.eye(len(cols))
            g_new = cinv_x[:, cols] @ np.linalg.solve(g_sub, np.isin(cols, mine).astype(np.float64))  # (hidden,)
            if g is not None and thresholded and float(g_new @ metric.cov @ g_new) > THRESHOLD_RMS ** 2:
                break  # the holds made it fire on ordinary text: keep the previous g
            g = g_new
            leak = x.T @ g if thresholded else np.abs(x.T @ g)  # g·x at every column
            leak[cols] = 0.0
            room = int(MAX_CONSTRAINTS * len(g)) - len(cols)  # beyond it, g·x = 1 could not hold
            more = np.flatnonzero(leak > leak_above)
            if len(more) == 0 or room <= 0:
                break
            cols = np.union1d(cols, more[np.argsort(-leak[more])][:min(room, per_round)])
        assert g is not None
        out.append(g.astype(np.float32))
    return out


def neuron_gate(g: F32, x_fire: F32, bias: F32 | None, theta: float) -> F32:
    """The gate of a neuron with direction g firing at the columns of `x_fire` `(hidden, n)`: a g, or
    with a bias direction c (c·x ≈ 1 everywhere) a (g - θ c) — closed below g·x ≈ θ and
    PRE_ACTIVATION at the subject."""
    if bias is None:
        return (PRE_ACTIVATION * g).astype(np.float32)
    c_fire = float(np.mean(bias @ x_fire))
    return ((PRE_ACTIVATION / (1.0 - theta * c_fire)) * (g - theta * bias)).astype(np.float32)


def check_plan(model: Model, facts: Sequence[Fact], layer: int) -> None:
    """A neuron plan's arguments: some facts, and a layer the model has."""
    if not facts:
        raise EditError("no facts to edit")
    if not 0 <= layer < model.config.n_layers:
        raise EditError(f"layer {layer} is out of range (layers 0-{model.config.n_layers - 1})")


def neuron_op(model: Model, layer: int, feature: int, gate: F32, g: F32, delta: F32, fact: Fact,
              label: str) -> PatchOp:
    """The feature insert of one neuron: `gate`, up = g, and down = delta / f(a), so that the MLP's
    output changes by `delta` where the gate is fully open (g·x = 1); its down_meta names the
    fact's target with cos(down, the target's direction)."""
    f_a = float(gated(model.config.activation, np.array([[PRE_ACTIVATION]], np.float32),
                      np.array([[1.0]], np.float32))[0, 0])
    down = (delta / f_a).astype(np.float32)
    tid = first_target_token(model, fact.target)
    score = float(target_direction(model, layer, tid) @ down / np.linalg.norm(down))
    return PatchOp("insert", layer, feature, {"gate": gate.astype(np.float32), "up": g.astype(np.float32),
                                              "down": down},
                   MetaOverride((tid,), (round(score, 4),)), fact.subject, fact.relation or "relation", fact.target,
                   reason=NEURON_REASON + label)


def plan_neuron_edit(model: Model, facts: Sequence[Fact], layer: int, input_metric: KeyMetric, first: int, decoys: Sequence[str],
                     neighbours: Mapping[str, Sequence[str]] | None = None,
                     objects: Mapping[str, Sequence[str]] | None = None,
                     n_prefixes: int = N_PREFIXES, earlier: Mapping[str, str] | None = None,
                     elsewhere: Sequence[HeldPrompt] = (),
                     memo: HeldMemo | None = None, lower: LowerLayers | None = None,
                     holds: Mapping[str, Sequence[str]] | None = None) -> NeuronPlan:
    """Compute (do not apply) one neuron per subject of `facts` at `layer` of `model` (whose FFN
    already carries the vindex's edits). `first`: the id of the first feature to add at the layer
    (the overlay's next_feature, the rest follow); `decoys`:
    subjects whose inputs the neurons must not fire on (besides the nearest subjects in `neighbours`
    and the subjects' known `objects`); `earlier`: subjects of the neurons already in place, each to
    what it is keyed on (`defaults.subject_keys`), held where a new neuron comes near them
    (`neuron_directions`); `elsewhere`: texts of the subjects whose neurons sit at other layers (this
    batch's and earlier ones'), held where a new neuron opens on them; `memo`: `held_keys`' columns
    at this layer read before (and kept for settling); `lower`: the texts' residuals below the layer,
    kept across an INSERT's layers (`capture.LowerLayers`); `holds`: per subject, prompts about its
    other relations whose answers the value must leave as they are (`relations.relation_holds`)."""
    check_plan(model, facts, layer)
    t0 = time.perf_counter()
    prefixes = model_prefixes(model, n_prefixes) if n_prefixes else ()
    groups = group_by_subject(facts)
    dense = dense_layers(model)
    edits = model.edits

    def ffn_layers(i: int) -> DenseLayer:
        return dense(i, edits)

    # a subject DESCRIBE's probes found nothing about has no other facts for the KL prompts to guard
    unknown = {s for s, objs in objects.items() if not objs} if objects is not None else set()
    values: list[ValueResult] = []
    for i in range(0, len(groups), VALUE_BATCH):
        values += optimise_values(model, groups[i: i + VALUE_BATCH], [layer], prefixes, ffn_layers, unknown=unknown,
                                  holds=holds)
    prompts = held_prompts(facts, decoys, neighbours=neighbours, objects=objects)
    held, owner_names = held_keys(model, prompts, [layer], point="input", memo=memo, lower=lower)
    templates = list(dict.fromkeys(f.prompt.replace(f.subject, "{}", 1) for f in facts))[:2]
    before = [HeldPrompt(t.format(e), e, key=k) for e, k in (earlier or {}).items()
              for t in ("{}", *templates)] + list(elsewhere)
    candidates = held_keys(model, before, [layer], point="input", memo=memo, lower=lower)[0][layer] if before else None
    index = {group[0].subject: j for j, group in enumerate(groups)}
    owners = [-1 if o is None else index[o] for o in owner_names]
    features = list(range(first, first + len(groups)))
    inputs = np.stack([v.inputs[layer] for v in values], axis=1)  # (hidden, n_groups)
    # fire fully at the subject's mean input over the optimised prompts, in FIRE_CONTEXTS and on the
    # facts' own prompts as given (no prefix): without the last, g·x on a prompt can fall well short
    # of 1 (SmolLM2-135M's "The official language of Germany is"), and a thresholded neuron's output,
    # (z-θ)z/(1-θ) of the value, misses its own prompt
    more = subject_inputs(model, layer, [group[0].subject for group in groups],
                          keys={group[0].subject: group[0].keyed for group in groups},
                          texts={group[0].subject: list(dict.fromkeys(f.prompt for f in group)) for group in groups},
                          lower=lower)
    fire = [np.concatenate([inputs[:, j: j + 1], x], axis=1) for j, x in enumerate(more)]
    bias = input_metric.bias
    limits = (THRESHOLD_NEAR_OTHERS, THRESHOLD_LEAK) if bias is not None else (NEAR_OTHERS, LEAK)
    directions = neuron_directions(input_metric, fire, held[layer], owners, candidates, *limits,
                                   thresholded=bias is not None)
    ops = [neuron_op(model, layer, feature, neuron_gate(g, x_fire, bias, THRESHOLD), g, value.deltas[layer], group[0],
                     "; ".join(f.label for f in group))
           for group, value, feature, g, x_fire in zip(groups, values, features, directions, fire)]
    return NeuronPlan(tuple(facts), layer, tuple(ops), tuple(features), tuple(values), len(prompts),
                      time.perf_counter() - t0)

