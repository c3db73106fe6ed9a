"""The edit evaluation's batched scoring against the same quantities computed one prompt at a time:
teacher-forced target log-probabilities (Scorer), the unrelated prompts' distributions, and greedy
continuations (`generate_batch` against `generate`)."""

from __future__ import annotations

import numpy as np

import larql
from larql.edit.measure import evaluate as ev
from larql.model.generate import log_softmax
from larql.model.targets import target_ids

TOL = 1e-5
PAIRS = [("The capital of France is", " Paris"), ("The capital of France is", " Rome"),
         ("The Eiffel Tower is located in the city of", " New York City"), ("Bees make", " honey"),
         ("Danielle Darrieux's mother tongue is", " English"), ("Toko Yasuda, the", " guitarist and singer")]


def one_by_one(m: larql.Model, prompt: str, target: str) -> list[tuple[float, bool]]:
    """Prefill the prompt, then feed the target a token at a time: each token's log p and top-1."""
    toks = target_ids(m, target)
    ids = m.tokenize(prompt)
    cache = m.new_cache(len(ids) + len(toks))
    logits = m.next_logits(ids, cache)
    out = []
    for i, tok in enumerate(toks):
        if i:
            logits = m.next_logits([toks[i - 1]], cache)
        lp = log_softmax(logits, np.float64)
        out.append((float(lp[tok]), int(np.argmax(lp)) == tok))
    return out


def test_prefetched_scores_equal_one_by_one(real_model: larql.Model) -> None:
    sc = ev.Scorer(real_model)
    sc.prefetch(PAIRS)
    lone = ev.Scorer(real_model)  # no prefetch: each pair runs alone
    assert any(len(target_ids(real_model, t)) >= 3 for _, t in PAIRS)
    for prompt, target in PAIRS:
        want = one_by_one(real_model, prompt, target)
        for got in (sc.token_logps(sc.prompt(prompt), target), lone.token_logps(lone.prompt(prompt), target)):
            assert len(got) == len(want)
            assert [t for _, t in got] == [t for _, t in want], (prompt, target)
            assert np.allclose([x for x, _ in got], [x for x, _ in want], atol=TOL * 10, rtol=TOL), (prompt, target, got, want)


def test_prefetch_in_several_groups(gemma: larql.Model) -> None:
    """More rows than one pass takes: the groups' scores are the same as one group's."""
    sc = ev.Scorer(gemma)
    pairs = [(f"Number {i} is followed by", f" number {i + 1} and then some") for i in range(40)]
    sc.prefetch(pairs)
    one = ev.Scorer(gemma)
    for prompt, target in pairs[::13]:
        a, b = sc.token_logps(prompt, target), one.token_logps(one.prompt(prompt), target)
        assert np.allclose([x for x, _ in a], [x for x, _ in b], atol=TOL * 10)


def test_unrelated_and_generation_batches_equal_one_by_one(real_model: larql.Model) -> None:
    m = real_model
    batched = ev.unrelated_logps(m)
    for prompt, got in list(zip(ev.UNRELATED, batched))[::5]:
        want = log_softmax(m.next_logits(m.tokenize(prompt)), np.float64)
        assert np.abs(got - want).max() <= TOL * 10 and np.argmax(got) == np.argmax(want), prompt
    prompts = [m.tokenize(p) for p in ev.UNRELATED[:6]]
    gens = m.generate_batch(prompts, 10)
    assert gens == [m.generate(p, max_new_tokens=10).ids for p in prompts]
    assert m.generate_batch([], 4) == []
