"""The edit methods and their defaults, importable without the runtime (LQL's planner and --plan)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

METHODS = ("rome", "memit", "feature", "neuron")
# The method INSERT uses when none is named: per model, the one that measured best on held-out prompts
# (benchmarks/bench_editing.py; the README's editing tables). On gemma3-270m's 40-fact set NEURON alone
# scored S 99.3 (ROME 95.9), NS 100 (90.4), unrelated top-1 kept 99.5% (93.8%); all 40 in one INSERT
# S 91.8 (MEMIT 87.3); ten capitals one after another kept 28 of 30 other prompts' top-1 (ROME 22).
# On SmolLM2-135M: alone S 81.4 (ROME 80.8), NS 100 (99.5); 35 in one INSERT S 77.4 (ROME stacked 80.7,
# MEMIT 74.9) keeping 91.7% of unrelated top-1s (ROME 66.7%, MEMIT 79.2%). A model not measured keeps ROME.
DEFAULT_METHOD = "rome"
MEASURED_DEFAULTS = {"gemma3-270m": "neuron", "smollm2-135m": "neuron"}


def default_method(model_name: str) -> str:
    """INSERT's method for a model when the statement names none."""
    return MEASURED_DEFAULTS.get(model_name, DEFAULT_METHOD)
# The layer whose MLP at the subject's last token carries facts, by crown discovery (model/crown.py):
# on gemma3-270m, ablating layer 3 there drops p(answer) from 0.08-0.64 to 0.001-0.006 in all three
# facts tried (no other layer comes close); SmolLM2-135M's, measured the same way, is CROWN_LAYERS'.
CROWN_LAYERS = {"gemma3-270m": 3, "smollm2-135m": 4}
N_PREFIXES = 6  # model-written prefixes each fact is optimised behind (ROME: 20, MEMIT: 5)
# METHOD NEURON in a large batch, where the INSERT's time is minutes, optimises each value behind fewer:
# each prefix is another context of every value step. gemma3-270m, 300 fictional facts in one INSERT
# (ES / PS / natural paraphrases; unrelated top-1s kept 24 of 24 in each): 6 prefixes 100 / 86.0 /
# 67.8, 4 100 / 86.7 / 68.0, 3 100 / 86.3 / 67.3, 2 100 / 84.7 / 65.0. Not in small ones: on real
# subjects 3 cost PS (CounterFact-40 each alone 96.9 -> 95.3, all 40 in one INSERT 95.3 -> 93.4;
# SmolLM2-135M's 35: 67.9 -> 65.3, 64.6 -> 62.8), where the time is seconds
LARGE_BATCH, LARGE_BATCH_PREFIXES = 100, 3


def neuron_prefixes(n_subjects: int) -> int:
    """How many model-written prefixes METHOD NEURON optimises each value behind, in an INSERT of
    `n_subjects` subjects."""
    return LARGE_BATCH_PREFIXES if n_subjects > LARGE_BATCH else N_PREFIXES


# nearest subjects (edit/methods/neighbours.py) whose keys an edit holds still; NS of single ROME edits on
# the five hardest records of benchmarks/data: 0 -> 57, 16 -> 80, 48 -> 87
N_NEIGHBOURS = 32


def default_layer(model_name: str, n_layers: int) -> int:
    return CROWN_LAYERS.get(model_name, max(1, n_layers // 6))


# METHOD NEURON adds one feature per subject to a layer (it recycled the layer's cheapest features up to
# session 28: the figures below were measured so): a layer holds NEURONS_PER_LAYER
# before the next of the model's NEURON_LAYERS (crown layer first) takes the overflow. gemma3-270m,
# 40 fictional facts in one INSERT at one layer (ES / held-out prefixed prompt / paraphrase, unrelated
# top-1s kept of 24, KL): layer 3 92.5 / 86.7 / 52.5, 20, 0.09; 4 95.0 / 99.2 / 55.0, 19, 0.14;
# 6 97.5 / 86.7 / 50.0, 17, 0.49; 2 65.0 / 56.7 / 35.0, 16, 0.85 (not used). SmolLM2: its crown layer only.
# Past 64 per layer a batch spreads over all of them: the 1,000 fictional facts in one INSERT over
# layers 3, 4, 6 (~333 neurons each) scored ES 37.1 / PS 23.2, unrelated top-1s kept 29% (KL 3.7); over
# 3-8 (~167 each) ES 70.9 / PS 53.7, kept 54% (KL 0.65). (160 facts all at layer 3: ES 100 / PS 93.0,
# so what breaks the large batch is neurons of different layers meeting — and past a few hundred one
# layer's density too: all 1,000 at layer 3, ES 35.3 / PS 31.6, 70.8% of unrelated top-1s kept;
# layer 9 is weaker, PS 69.5 for 80 facts. Holding each layer's neurons off the other layers' subjects,
# `neuron.THRESHOLD_ROUNDS`: 300 facts ES 84.7 -> 89.7 / PS 48.0 -> 55.3, same 18 of 24 kept; all 1,000
# ES 66.3 / PS 46.7, kept 62.5% (KL 0.54).) Layers 5, 7 and 8 come after 3, 4, 6 so that batches up
# to 192 facts keep the layers they were measured on.
NEURONS_PER_LAYER = 64
NEURON_LAYERS: dict[str, tuple[int, ...]] = {"gemma3-270m": (3, 4, 6, 5, 7, 8), "smollm2-135m": (4,)}


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
    would share a key). At a low layer the input at a shared last word is mostly that word's own:
    250 fictional companies in one INSERT keyed on " Pharma", " Labs"... opened each other's neurons
    (gemma3-270m: ES 31.6, PS 26.5, 18 of 24 unrelated top-1s kept); keyed on their names they did not
    (99.2 / 86.7 / 23)."""
    words = {s: [m.start() for m in re.finditer(r"\S+", s)] for s in dict.fromkeys(subjects)}
    shared: Counter[str] = Counter()  # each proper ending of words ("Pharma", "of America"), per subject
    for s, starts in words.items():
        shared.update(s[i:] for i in starts[1:])
    keys = {s: next((s[:i].rstrip() for i in starts[1:] if shared[s[i:]] > 1), s) for s, starts in words.items()}
    taken = Counter(keys.values())  # "Lefel Pharma" and "Lefel Labs" both on "Lefel" could not be told apart
    return {s: k if taken[k] == 1 else s for s, k in keys.items()}
