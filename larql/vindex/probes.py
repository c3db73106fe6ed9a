"""Probe edges: relation templates run through the model, reporting what it answers.

Each relation has a template and a few worked examples; the prompt is two examples (never about the
entity itself) followed by the entity, which pins the answer's format to a short noun phrase. An
answer becomes an edge when the model's first answer token has probability >= MIN_PROB and the
answer reads as a word (templates that do not apply to an entity, such as the capital of a person,
or an entity the model does not know, mostly fall below the bar or produce non-words).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from larql.model import Model
from larql.model.prefix import common_prefix
from larql.vindex.tokens import Edge, clean_token, is_content_token

# The bar a probe's first answer token must clear to be shown, chosen on measured data
# (benchmarks/bench_probe_threshold.py, gemma3-270m): 41 known facts against 40 made-up names the
# model cannot know, 8 templates each. At 0.25, 90% of the facts were shown right but every made-up
# name got edges (2.6 each: "Vrellandia" -> continent Asia); at 0.7, 76% shown right, none wrong,
# and 7% of made-up names show an edge (0.10 per name). 0.7 is near the best of right minus made-up
# (0.72); the templates' default guesses (Asia, euro, German) sit at 0.3-0.8 for unknown names.
MIN_PROB = 0.7
MAX_ANSWER_TOKENS = 4
STOPS = (".", ",", "\n", ";")  # where an answer ends


@dataclass(frozen=True)
class RelationTemplate:
    relation: str
    template: str  # "{}" is the entity
    examples: tuple[tuple[str, str], ...]  # (entity, answer) shots


TEMPLATES: tuple[RelationTemplate, ...] = (
    RelationTemplate("capital", "The capital of {} is",
                     (("Germany", "Berlin"), ("Italy", "Rome"), ("Egypt", "Cairo"))),
    RelationTemplate("language", "The official language of {} is",
                     (("Germany", "German"), ("Italy", "Italian"), ("Brazil", "Portuguese"))),
    RelationTemplate("currency", "The currency of {} is the",
                     (("the United States", "dollar"), ("Japan", "yen"), ("Mexico", "peso"))),
    RelationTemplate("continent", "{} is in the continent of",
                     (("Germany", "Europe"), ("Kenya", "Africa"), ("Peru", "South America"))),
    RelationTemplate("located-in", "{} is a city in the country of",
                     (("Lyon", "France"), ("Osaka", "Japan"), ("Munich", "Germany"))),
    RelationTemplate("born-in", "{} was born in the country of",
                     (("Frida Kahlo", "Mexico"), ("Isaac Newton", "England"), ("Leo Tolstoy", "Russia"))),
    RelationTemplate("occupation", "By profession, {} was a",
                     (("Ludwig van Beethoven", "composer"), ("Marie Curie", "physicist"), ("Vincent van Gogh", "painter"))),
    RelationTemplate("nationality", "The nationality of {} was",
                     (("Frida Kahlo", "Mexican"), ("Isaac Newton", "English"), ("Leo Tolstoy", "Russian"))),
)


def probe_prompt(t: RelationTemplate, entity: str) -> str:
    shots = [(e, a) for e, a in t.examples if e.lower() != entity.lower()][:2]
    lines = [f"{t.template.format(e)} {a}." for e, a in shots]
    return " ".join([*lines, t.template.format(entity)])


def _answer_text(model: Model, answer: list[int]) -> str:
    text = model.detokenize(answer)
    for stop in STOPS:
        text = text.split(stop)[0]
    return clean_token(text)


def run_probes(model: Model, templates: tuple[RelationTemplate, ...], entity: str,
               min_prob: float = 0.0) -> list[tuple[str, float]]:
    """(answer text, probability of its first token) for each template, all templates in one batch:
    one packed prefill (each template's worked examples reused from the model's last probe, see
    model/prefix.py), then one batched greedy step at a time for the answers still running. An
    answer whose first token is below `min_prob` stops at that token (its edge will not be shown)."""
    return _run_pairs(model, [(t, entity) for t in templates], min_prob)


def _run_pairs(model: Model, pairs: Sequence[tuple[RelationTemplate, str]],
               min_prob: float) -> list[tuple[str, float]]:
    """run_probes over (template, entity) pairs, all in one batch."""
    prompts = [model.tokenize(probe_prompt(t, entity)) for t, entity in pairs]
    _prime(model, pairs, prompts)
    starts = [model.prefixes.start(model, ("probe", t.template), ids, MAX_ANSWER_TOKENS)
              for (t, _), ids in zip(pairs, prompts)]
    caches = [cache for cache, _ in starts]
    first, logp = model.next_top1_batch([rest for _, rest in starts], caches)  # (pairs,) each
    for (t, _), ids, cache in zip(pairs, prompts, caches):
        model.prefixes.keep(model, ("probe", t.template), ids, cache)
    answers = [[int(t)] for t in first]
    probs = [float(p) for p in np.exp(logp)]
    running = [b for b, p in enumerate(probs) if p >= min_prob]
    for _ in range(MAX_ANSWER_TOKENS - 1):
        running = [b for b in running if not any(stop in model.detokenize(answers[b]) for stop in STOPS)]
        if not running:
            break
        step, _ = model.next_top1_batch([[answers[b][-1]] for b in running], [caches[b] for b in running])
        for b, token in zip(running, step):
            answers[b].append(int(token))
    return [(_answer_text(model, a), p) for a, p in zip(answers, probs)]


def _prime(model: Model, pairs: Sequence[tuple[RelationTemplate, str]], prompts: Sequence[list[int]]) -> None:
    """Run once, and keep, the token prefix that each template's prompts in this batch share (its
    worked examples) where no kept probe holds it yet: the batch's prompts then run only their own
    tails, not every one its ~25 tokens (the first batch of an INSERT of 200 subjects: 256 prompts
    of a few tokens each instead of ~6,400 tokens, a quarter of all its probes' work)."""
    if model.revision() is None:  # nothing would be kept (model/prefix.py)
        return
    shared: dict[str, list[int]] = {}
    for (t, _), ids in zip(pairs, prompts):
        have = shared.get(t.template)
        shared[t.template] = list(ids) if have is None else have[:common_prefix(have, ids)]
    counts = Counter(t.template for t, _ in pairs)
    todo = []
    for template, ids in shared.items():
        if counts[template] < 2 or len(ids) < 2:
            continue
        cache, rest = model.prefixes.start(model, ("probe", template), ids)
        if len(rest) > 1:  # the kept prompt shares less than this batch's prefix
            todo.append((template, ids, cache, rest))
    if todo:
        model.next_top1_batch([rest for *_, rest in todo], [cache for _, _, cache, _ in todo])
        for template, ids, cache, _ in todo:
            model.prefixes.keep(model, ("probe", template), ids, cache)


# (template, entity) probes run together by probe_edges_many: the lm_head's chunks are dequantized once
# a batch, and its product runs at 2.3 ms a row at 256 rows against 4.9 at 64 (gemma3-270m, two threads)
PAIRS_PER_BATCH = 256


def probe_edges_many(model: Model, entities: Sequence[str], templates: tuple[RelationTemplate, ...] = TEMPLATES,
                     ) -> list[list[Edge]]:
    """`probe_edges` of each entity, the probes of several entities batched together (an INSERT of
    hundreds of subjects asks what the model knows about each)."""
    pairs = [(t, e) for e in entities for t in templates]
    answers: list[tuple[str, float]] = []
    for i in range(0, len(pairs), PAIRS_PER_BATCH):
        answers += _run_pairs(model, pairs[i: i + PAIRS_PER_BATCH], MIN_PROB)
    out = []
    for j, entity in enumerate(entities):
        got = answers[j * len(templates): (j + 1) * len(templates)]
        edges = _edges(entity, templates, got)
        out.append(sorted((e for e in edges if e.score >= MIN_PROB), key=lambda e: -e.score))
    return out


def _edges(entity: str, templates: Sequence[RelationTemplate], answers: Sequence[tuple[str, float]]) -> list[Edge]:
    edges = []
    for t, (answer, prob) in zip(templates, answers):
        words = answer.split()
        if words and is_content_token(words[0]) and answer.lower() != entity.lower():
            edges.append(Edge(answer, prob, -1, -1, "probe", t.relation))
    return edges


def run_probe(model: Model, t: RelationTemplate, entity: str) -> tuple[str, float]:
    """(answer text, probability of its first token) for one template."""
    return run_probes(model, (t,), entity)[0]


def probe_candidates(model: Model, entity: str, templates: tuple[RelationTemplate, ...] = TEMPLATES,
                     progress: Callable[[str, int, int], None] | None = None, min_prob: float = 0.0) -> list[Edge]:
    """Every template's answer that reads as a word, whatever its probability (probe_edges keeps
    those that clear MIN_PROB; benchmarks/bench_probe_threshold.py measures where that bar goes).
    Answers below `min_prob` are cut at their first token."""
    edges = _edges(entity, templates, run_probes(model, templates, entity, min_prob))
    if progress is not None:
        progress("probe edges", len(templates), len(templates))
    return edges


def probe_edges(model: Model, entity: str, templates: tuple[RelationTemplate, ...] = TEMPLATES,
                progress: Callable[[str, int, int], None] | None = None) -> list[Edge]:
    """Edges for every template whose answer clears MIN_PROB, most probable first.
    `progress(stage, done, total)` hears when the templates, run as one batch, are done."""
    edges = [e for e in probe_candidates(model, entity, templates, progress, MIN_PROB) if e.score >= MIN_PROB]
    return sorted(edges, key=lambda e: -e.score)


def probe_answers(model: Model, pairs: Sequence[tuple[RelationTemplate, str]]) -> list[tuple[str, float]]:
    """(answer text, probability of its first token) of each (template, entity) pair, whatever the
    probability, in batches of PAIRS_PER_BATCH: what an edit's report reads again after the edit."""
    out: list[tuple[str, float]] = []
    for i in range(0, len(pairs), PAIRS_PER_BATCH):
        out += _run_pairs(model, pairs[i: i + PAIRS_PER_BATCH], 0.0)
    return out
