"""Settling a layer's new neurons against the texts of every subject (METHOD NEURON, edit/methods/neuron.py).

A neuron is planned to be 0 at the other subjects' inputs where it would open (`neuron_directions`),
but on inputs taken one way (the mean over the optimised prompts, the subject opening a text) and
within bounds (a few solves, a bounded rms), and a neuron that opens on another subject's prompt
writes its own target there, and a fact's prompt with several other neurons open mostly loses
its edit (docs/design/edit-defaults.md). So once a layer's neurons are
recorded, every subject's texts (itself, its prompts, two of the batch's templates) are read through
the edited model, and a neuron that opens on another subject's text (g·x > SETTLE_OPEN) has its
direction moved as little as possible (in Σ's norm, Σ = E[x xᵀ]: the least change of g·x on
ordinary text) to be 0 there and still 1 at its own subject's texts; the gate follows g. Layers go
lowest first and each is settled before the next is planned, so that the next layer's values are
optimised on what these neurons really do (settling all layers after the fact fails: the values
have learnt to live with the leaks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from larql.edit.methods.capture import LowerLayers
from larql.edit.methods.facts import Fact
from larql.edit.methods.neuron import THRESHOLD, THRESHOLD_RMS, neuron_gate
from larql.edit.methods.rome import CONSTRAINT_RIDGE, KeyMetric
from larql.edit.methods.weight_edit import HeldMemo, HeldPrompt, held_keys
from larql.edit.patches.patch import PatchOp
from larql.edit.state.edited import EditTarget
from larql.model.model import Model

F32 = NDArray[np.float32]
SETTLE_OPEN = 0.5  # g·x at another subject's text above which the neuron counts as open there (θ)
OWN_TOLERANCE = 0.1  # |g·x - 1| at the subject's own inputs that a settled direction may leave


@dataclass(frozen=True)
class Settled:
    ops: list[PatchOp]
    moved: int  # neurons whose direction changed
    leaks: int  # (neuron, other subject's text) pairs held


def settle_direction(metric: KeyMetric, g: F32, fire: F32, leaks: F32, max_rms: float = np.inf,
                     per_round: int = 32) -> tuple[F32, int]:
    """g + δ with δ the smallest in Σ's norm such that (g + δ)·x = 1 at the columns of `fire`
    `(hidden, n)` and 0 at those of `leaks` `(hidden, m)`, the leaks taken worst first, `per_round`
    at a time, while g's rms on ordinary text, sqrt(gᵀΣg), stays under `max_rms` (a leak nearly
    the same as the subject's own input could only be told apart by a g that opens everywhere);
    also returns how many leaks it holds."""
    g64 = g.astype(np.float64)
    order = np.argsort(-(leaks.T @ g64))
    best, held = g.astype(np.float32), 0
    m = leaks.shape[1]
    for n in [0, *range(per_round, m, per_round), m] if m else [0]:
        x = np.concatenate([fire, leaks[:, order[:n]]], axis=1).astype(np.float64)  # (hidden, k)
        want = np.concatenate([np.ones(fire.shape[1]), np.zeros(n)]) - x.T @ g64
        cinv_x = metric.solve(x)
        gram = x.T @ cinv_x
        gram += CONSTRAINT_RIDGE * float(np.mean(np.diag(gram))) * np.eye(len(gram))
        g_new = g64 + cinv_x @ np.linalg.solve(gram, want)
        if n and (float(g_new @ metric.cov @ g_new) > max_rms ** 2
                  or np.any(np.abs(fire.T @ g_new - 1.0) > OWN_TOLERANCE)):
            break  # too long, or the subject's own inputs no longer open it fully (a leak too like them)
        best, held = g_new.astype(np.float32), n
    return best, held


SETTLE_TEMPLATES = 2  # the batch's relation templates, besides its own prompts, each subject is read in


def settle_texts(facts: Sequence[Fact], earlier: Mapping[str, str], templates: int = SETTLE_TEMPLATES,
                 ) -> dict[str, list[HeldPrompt]]:
    """Each subject's texts to settle on, read where it is keyed: the subject opening a text, its
    facts' prompts and the batch's first `templates` relation templates; subjects of neurons already
    in place (`earlier`, each to its key) in the templates alone."""
    forms = list(dict.fromkeys(f.prompt.replace(f.subject, "{}", 1) for f in facts))[:templates]
    texts: dict[str, list[str]] = {}
    keys = dict(earlier) | {f.subject: f.keyed for f in facts}
    for f in facts:
        texts.setdefault(f.subject, [f.subject]).append(f.prompt)
    for subject in earlier:
        texts.setdefault(subject, [subject])
    for subject, own in texts.items():
        own += [t.format(subject) for t in forms if t.format(subject) not in own]
    return {s: [HeldPrompt(t, s, s, keys[s]) for t in own] for s, own in texts.items()}


def settle_layer(v: EditTarget, model: Model, ops: Sequence[PatchOp], texts: Mapping[str, Sequence[HeldPrompt]],
                 metric: KeyMetric, memo: HeldMemo | None = None, lower: LowerLayers | None = None) -> Settled:
    """Settle one layer's new neuron inserts `ops` — the last ones recorded on `v`'s patch stack, put
    back settled — against every subject's `texts` (its own, and those of the subjects it must stay
    off) as the edited model reads them now."""
    layer = ops[0].layer
    inputs, owners = held_keys(model, [p for ps in texts.values() for p in ps], [layer],
                               point="input", memo=memo, lower=lower)
    x = inputs[layer]  # (hidden, n)
    who = np.array([o if o is not None else "" for o in owners], dtype=object)
    out, moved, held = list(ops), 0, 0
    for i, op in enumerate(ops):
        if op.entity is None or op.entity not in texts:
            continue
        g = op.vectors["up"].astype(np.float64)
        own = who == op.entity
        leak = (~own) & (who != "") & (g @ x > SETTLE_OPEN)
        if not leak.any():
            continue  # left as planned: a move would disturb what the plan held at 0 (decoys, objects)
        bound = max(THRESHOLD_RMS, float(np.sqrt(g @ metric.cov @ g)))  # no longer than it was, or the bound
        g_new, n_held = settle_direction(metric, g.astype(np.float32), x[:, own], x[:, leak], bound)
        moved, held = moved + 1, held + n_held
        out[i] = replace(op, vectors={**op.vectors, "up": g_new, "gate": neuron_gate(g_new, x[:, own], metric.bias, THRESHOLD)})
    if moved:
        v.patches.undo(len(ops))
        v.patches.record_all(list(out))
    return Settled(out, moved, held)
