"""The edit methods and their defaults, importable without the runtime (LQL's planner and --plan)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

METHODS = ("rome", "memit", "feature", "neuron")
# Every default below was chosen by measurement; docs/design/edit-defaults.md has the figures and why.
# The method INSERT uses when none is named: per model, the one that measured best on held-out prompts
# (benchmarks/bench_editing.py). A model not measured keeps ROME.
DEFAULT_METHOD = "rome"
MEASURED_DEFAULTS = {"gemma3-270m": "neuron", "smollm2-135m": "neuron"}


def default_method(model_name: str) -> str:
    """INSERT's method for a model when the statement names none."""
    return MEASURED_DEFAULTS.get(model_name, DEFAULT_METHOD)


# the layer whose MLP at the subject's last token carries facts, by crown discovery (model/crown.py)
CROWN_LAYERS = {"gemma3-270m": 3, "smollm2-135m": 4}
N_PREFIXES = 6  # model-written prefixes each fact is optimised behind (ROME: 20, MEMIT: 5)
# METHOD NEURON in an INSERT of more than LARGE_BATCH subjects optimises each value behind fewer prefixes:
# there the time is minutes and fewer cost no quality; in small ones they cost paraphrase accuracy
LARGE_BATCH, LARGE_BATCH_PREFIXES = 100, 3


def neuron_prefixes(n_subjects: int) -> int:
    """How many model-written prefixes METHOD NEURON optimises each value behind, in an INSERT of
    `n_subjects` subjects."""
    return LARGE_BATCH_PREFIXES if n_subjects > LARGE_BATCH else N_PREFIXES


N_NEIGHBOURS = 32  # nearest subjects (edit/methods/neighbours.py) whose keys an edit holds still


def default_layer(model_name: str, n_layers: int) -> int:
    return CROWN_LAYERS.get(model_name, max(1, n_layers // 6))


# METHOD NEURON adds one feature per subject to a layer: a layer holds NEURONS_PER_LAYER before the next
# of the model's NEURON_LAYERS (crown layer first) takes the overflow; past that, the emptiest
NEURONS_PER_LAYER = 64
NEURON_LAYERS: dict[str, tuple[int, ...]] = {"gemma3-270m": (3, 4, 6, 5, 7, 8), "smollm2-135m": (4,)}


# Where METHOD NEURON with key_on="query" puts a neuron keyed on the question (edit/methods/query_neuron.py)
# for a subject the model knows something about: a layer where the prompt's last token carries subject
# and relation together. Models not listed key every neuron on its subject (no query layer measured).
QUERY_LAYERS: dict[str, int] = {"gemma3-270m": 12}


def query_layer(model_name: str) -> int | None:
    return QUERY_LAYERS.get(model_name)


def neuron_layers(model_name: str, n_layers: int) -> tuple[int, ...]:
    """The layers METHOD NEURON fills, in order (the crown layer alone for a model not measured)."""
    return NEURON_LAYERS.get(model_name, (default_layer(model_name, n_layers),))


# REBALANCE's loop (edit/maintain/rebalance.py; LARQL's factors and MAX, a band that holds INSERT's p >= 0.9 goal)
REBALANCE_MAX, REBALANCE_CONVERGED_MAX = 16, 64
REBALANCE_FLOOR, REBALANCE_CEILING = 0.30, 0.95
REBALANCE_GROW, REBALANCE_SHRINK = 1.15, 0.85


def is_key_of(key: str, subject: str) -> bool:
    """Whether `key` is the subject's leading whole words (or all of it): what a neuron can key on."""
    return key == subject or subject.startswith(key + " ")


def subject_keys(subjects: Iterable[str]) -> dict[str, str]:
    """What METHOD NEURON keys each subject on (a neuron fires at its key's last token): the subject
    less the trailing words it shares with another subject of more words than those ("Dreitromen
    Pharma" beside "Lefel Pharma": "Dreitromen"), else the whole subject (also where two subjects
    would share a key). At a low layer the input at a shared last word is mostly that word's own, so
    neurons keyed on a shared " Pharma" open on each other's subjects."""
    words = {s: [m.start() for m in re.finditer(r"\S+", s)] for s in dict.fromkeys(subjects)}
    shared: Counter[str] = Counter()  # each proper ending of words ("Pharma", "of America"), per subject
    for s, starts in words.items():
        shared.update(s[i:] for i in starts[1:])
    keys = {s: next((s[:i].rstrip() for i in starts[1:] if shared[s[i:]] > 1), s) for s, starts in words.items()}
    taken = Counter(keys.values())  # "Lefel Pharma" and "Lefel Labs" both on "Lefel" could not be told apart
    return {s: k if taken[k] == 1 else s for s, k in keys.items()}
