"""A neuron keyed on the query, not the subject: it fires at the prompt's last token, where the subject
and the relation have met, so an edit of one relation leaves the subject's others as they were.

A subject-keyed neuron (neuron.py) writes its value wherever the subject's last token is read, and
every question about the subject reads it: "France's capital is Manila" then also put France in Asia.
At a later layer the last token of "The capital of France is" already carries what is being asked
about whom; there the neuron's direction g is solved as neuron.py solves it (smallest in Σ's norm,
thresholded by the bias direction where the layer has one) to fire on the fact's prompt — bare,
behind the model-written prefixes, and in the words `facts.rewrites` gives — and to stay shut on
the subject's other relations asked the same ways, on the same question about the subject's nearest
subjects and the decoys, and on the queries of the query neurons already in place. Its up is a
second direction, 1 on the same texts and 0 on the same question asked of other subjects (the
batch's included): where the gate half-opens on another subject's question, little is written. The
value is optimised at the last token (value.py, `at_last`): nothing else needs holding there,
because the gate is shut wherever else the value could be read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from larql.edit.methods.capture import capture_batch
from larql.edit.methods.defaults import N_PREFIXES
from larql.edit.methods.facts import Fact, model_prefixes, rewrites
from larql.edit.methods.neuron import (
    LEAK,
    NEAR_OTHERS,
    THRESHOLD_NEAR_OTHERS,
    NeuronPlan,
    check_plan,
    neuron_directions,
    neuron_gate,
    neuron_op,
)
from larql.edit.methods.rome import KeyMetric
from larql.edit.methods.stats import CHUNK, corpus_chunks
from larql.edit.methods.value import ValueResult, optimise_values
from larql.edit.methods.weight_edit import VALUE_BATCH, dense_layers
from larql.model.forward import norm
from larql.model.grad import DenseLayer
from larql.model.model import Model
from larql.vindex.probes import TEMPLATES

F32 = NDArray[np.float32]
# Where a query neuron opens: lower than a subject neuron's, because a paraphrase's last token is
# further from the prompt's than a subject token is from itself (g·x 0.5-0.8 on held-out paraphrases)
QUERY_THRESHOLD = 0.3
# Ordinary text a query neuron is held shut on where it would open: the question's words are common
# ones ("is", "of"), unlike a subject's. Every position of the statistics corpus's first chunks, and
# the last token of short openings of it (a short prompt's last token is read otherwise than a long
# text's: "A week has seven" opened a capital's neuron at a quarter of its value)
GENERIC_CHUNKS, GENERIC_OPENINGS = 2, 128
# A batch's questions asked about its other subjects (at most this many in all), which its up direction
# is held at 0 on: a gate opened at 0.91 by "Tunisia's capital is" for Chile's capital when both were
# edited in one INSERT (an edited subject is never another's automatic neighbour), and a gate held shut
# there as well grew long enough to open on 17% of ordinary tokens
CROSSINGS, CROSSINGS_PER_FACT = 4096, 128


def generic_inputs(model: Model, layer: int, n_chunks: int = GENERIC_CHUNKS,
                   n_openings: int = GENERIC_OPENINGS) -> F32:
    """The MLP's normalised inputs `(hidden, n)` at every position but the first of the statistics
    corpus's first `n_chunks` chunks, and at the last token of `n_openings` short openings (4-12
    tokens) of the chunks after them."""
    name = f"blocks.{layer}.hook_resid_mid"
    chunks = corpus_chunks(model, (n_chunks + n_openings) * CHUNK)
    lengths = 4 + np.arange(n_openings) % 9
    openings = [chunk[: 1 + int(n)] for chunk, n in zip(chunks[n_chunks:], lengths)]
    got = capture_batch(model, [*chunks[:n_chunks], *openings], [name])
    x = np.concatenate([g[name][1:] for g in got[:n_chunks]] + [g[name][-1:] for g in got[n_chunks:]])  # (n, hidden)
    return norm(model.config, x, model.weights.layers[layer].ffn_norm).T


def query_inputs(model: Model, layer: int, texts: Sequence[str]) -> F32:
    """The MLP's normalised inputs `(hidden, n)` at the last token of each text."""
    if not texts:
        return np.zeros((model.config.hidden, 0), np.float32)
    name = f"blocks.{layer}.hook_resid_mid"
    got = capture_batch(model, [model.tokenize(t) for t in texts], [name])
    x = np.stack([g[name][-1] for g in got])  # (n, hidden)
    return norm(model.config, x, model.weights.layers[layer].ffn_norm).T


def relation_forms(fact: Fact) -> list[str]:
    """The fact's question as DESCRIBE's probe for its relation asks it (where the fact names one of
    the probes' relations) and in the words `rewrites` gives, less the fact's own prompts: more
    phrasings of the question for the gate and the value to learn from, so paraphrases open it."""
    template = next((t.template for t in TEMPLATES if fact.relation and t.relation.lower() == fact.relation.lower()),
                    None)
    if template is None:
        return []
    asked = template.format(fact.subject)
    return [q for q in dict.fromkeys([asked, *rewrites(asked, fact.subject)])
            if q not in (fact.prompt, *fact.prompts)]


def bos_input(model: Model, layer: int) -> F32:
    """The MLP's normalised input `(hidden, 1)` at position 0 (BOS, where the model puts one; else the
    first token of an ordinary text): the attention sink, the same in every text."""
    name = f"blocks.{layer}.hook_resid_mid"
    first = corpus_chunks(model, CHUNK)[0][:1]
    x = capture_batch(model, [first], [name])[0][name][:1]
    return norm(model.config, x, model.weights.layers[layer].ffn_norm).T


def fire_texts(fact: Fact, prefixes: Sequence[str]) -> list[str]:
    """The query as the value step optimises it: the prompt and its rewrites, bare and behind each prefix."""
    forms = [fact.prompt, *fact.prompts, *(r for r in rewrites(fact.prompt, fact.subject) if r != fact.prompt)]
    return list(dict.fromkeys(p + f for f in forms for p in ("", *prefixes)))


def other_queries(fact: Fact, relations: Sequence[str] | None) -> list[str]:
    """Questions about the fact's subject that are not the fact's: its other relations (`relations`,
    the prompts `relations.relation_holds` found answered otherwise) or, where none are given, every
    probe template but the edited relation's, each asked the ways `rewrites` knows."""
    if relations is None:
        asked = [t.template.format(fact.subject) for t in TEMPLATES
                 if not (fact.relation and t.relation.lower() == fact.relation.lower())]
        relations = [q for a in asked for q in (a, *rewrites(a, fact.subject))]
    return [q for q in dict.fromkeys([*relations, fact.subject]) if q != fact.prompt]


def batch_crossings(facts: Sequence[Fact], also: Sequence[str] = (), limit: int = CROSSINGS) -> list[tuple[int, str]]:
    """(fact index, text): each fact's question (its prompt and extra prompts) asked about the batch's
    other subjects and the subjects `also` names (edited before). At most `limit` texts, and
    CROSSINGS_PER_FACT a fact, the other subjects spread evenly when there are more than a fact's share."""
    subjects = list(dict.fromkeys([*(f.subject for f in facts), *also]))
    per = max(1, min(CROSSINGS_PER_FACT, limit // max(1, len(facts))))
    out: list[tuple[int, str]] = []
    for j, f in enumerate(facts):
        others = [s for s in subjects if s != f.subject]
        if len(others) > per:
            others = [others[int(i)] for i in np.linspace(0, len(others) - 1, per).round()]
        budget = max(1, per // max(1, len(others)))  # texts a subject when the fact has several prompts
        forms = [p for p in (f.prompt, *f.prompts) if f.keyed in p][:budget]
        out += [(j, t) for t in dict.fromkeys(p.replace(f.keyed, s, 1) for s in others for p in forms)]
    return out[:limit]


def plan_query_neuron_edit(model: Model, facts: Sequence[Fact], layer: int, input_metric: KeyMetric, first: int,
                           decoys: Sequence[str], neighbours: Mapping[str, Sequence[str]] | None = None,
                           holds: Mapping[str, Sequence[str]] | None = None, earlier: Sequence[str] = (),
                           n_prefixes: int = N_PREFIXES, edited: Sequence[str] = ()) -> NeuronPlan:
    """Compute (do not apply) one query neuron per fact at `layer`. `decoys` and `neighbours` (per
    subject): subjects the fact's question is held shut for; `holds`: per subject, prompts about its
    other relations (else every other probe template is asked); `earlier`: queries of the neurons
    already in place at the layer, held where a new neuron comes near them; `edited`: subjects of the
    neurons already in place, the fact's question asked of them held at 0 by the up direction."""
    check_plan(model, facts, layer)
    t0 = time.perf_counter()
    prefixes = model_prefixes(model, n_prefixes) if n_prefixes else ()
    dense = dense_layers(model)
    edits = model.edits

    def ffn_layers(i: int) -> DenseLayer:
        return dense(i, edits)

    groups = [[f] for f in facts]  # one neuron per question, even where two facts share a subject
    values: list[ValueResult] = []
    for i in range(0, len(groups), VALUE_BATCH):
        values += optimise_values(model, groups[i: i + VALUE_BATCH], [layer], prefixes, ffn_layers, at_last=True)
    fire = [query_inputs(model, layer, fire_texts(f, prefixes)) for f in facts]
    held_texts: list[str] = []
    owners: list[int] = []
    for j, f in enumerate(facts):
        near = [n for n in (neighbours or {}).get(f.subject, ()) if n.lower() != f.subject.lower()]
        others = [f.prompt.replace(f.keyed, s, 1) for s in dict.fromkeys([*near, *decoys])
                  if s.lower() != f.subject.lower()]
        mine = [*other_queries(f, None if holds is None else holds.get(f.subject)), *others]
        held_texts += mine
        owners += [j] * len(mine)
    held = np.concatenate([query_inputs(model, layer, held_texts), bos_input(model, layer)], axis=1)
    owners += [-1]  # every neuron is shut at BOS: every text has it, and every later token reads it
    candidates = np.concatenate([query_inputs(model, layer, list(earlier)), generic_inputs(model, layer)], axis=1)
    bias = input_metric.bias
    limits = (THRESHOLD_NEAR_OTHERS, QUERY_THRESHOLD) if bias is not None else (NEAR_OTHERS, LEAK)
    directions = neuron_directions(input_metric, fire, held, owners, candidates, *limits,
                                   thresholded=bias is not None)
    gates = [neuron_gate(g, x_fire, bias, QUERY_THRESHOLD) for g, x_fire in zip(directions, fire)]
    # the neuron's up: 1 on its question, 0 on the same question about the other subjects (neighbours,
    # decoys, the batch's, whether or not the batch edits theirs too), on its subject's other questions
    # and on the ordinary text where its gate still opens, so that where the gate opens on anything
    # but its question, little is written
    crossings = batch_crossings(facts, edited)
    crossed = query_inputs(model, layer, [t for _, t in crossings])
    opened = [(j, k) for j, gate in enumerate(gates) for k in np.flatnonzero(gate @ candidates > 0)]
    ups = neuron_directions(input_metric, fire,
                            np.concatenate([held[:, :-1], crossed, candidates[:, [k for _, k in opened]]], axis=1),
                            [*owners[:-1], *(j for j, _ in crossings), *(j for j, _ in opened)], None, 0, np.inf)
    features = list(range(first, first + len(facts)))
    ops = [neuron_op(model, layer, feature, gate, up, value.deltas[layer], fact, fact.label)
           for fact, value, feature, gate, up in zip(facts, values, features, gates, ups)]
    return NeuronPlan(tuple(facts), layer, tuple(ops), tuple(features), tuple(values), len(held_texts),
                      time.perf_counter() - t0)
