"""DESCRIBE's probes run as one batch, reusing each template's worked examples from the model's
previous probe (model/prefix.py): the same answers and probabilities as running every template
alone from an empty cache, and no reuse once the model's edits change."""

from __future__ import annotations

import numpy as np
import pytest

import larql
from larql.edit.patches.overlay import FeatureOverride, PatchOverlay
from larql.edit.state.walk_ffn import OverlayEdits
from larql.model.ffn import FFN
from larql.model.generate import log_softmax
from larql.model.hooks import HookFns
from larql.model.prefix import PrefixCache, fork
from larql.vindex.probes import (
    MAX_ANSWER_TOKENS,
    MIN_PROB,
    TEMPLATES,
    probe_candidates,
    probe_edges,
    probe_edges_many,
    probe_prompt,
    run_probes,
)
from larql.vindex.probes import _answer_text as answer_text
from tests.synthetic import TinySpec, hf_weights, write_gguf

TOL = 1e-5


def one_by_one(model: larql.Model, entity: str) -> list[tuple[list[int], float]]:
    """Each template alone from a fresh cache: greedy answer ids (up to a stop) and first-token p."""
    out = []
    for t in TEMPLATES:
        ids = model.tokenize(probe_prompt(t, entity))
        cache = model.new_cache(len(ids) + MAX_ANSWER_TOKENS)
        logits = model.next_logits(ids, cache)
        answer = [int(np.argmax(logits))]
        prob = float(np.exp(log_softmax(logits)[answer[0]]))
        while len(answer) < MAX_ANSWER_TOKENS and not any(s in model.detokenize(answer) for s in ".,\n;"):
            answer.append(int(np.argmax(model.next_logits([answer[-1]], cache))))
        out.append((answer, prob))
    return out


def check_same(model: larql.Model, entity: str) -> None:
    want = one_by_one(model, entity)
    got = run_probes(model, TEMPLATES, entity)
    for t, (text, prob), (ids, want_prob) in zip(TEMPLATES, got, want):
        assert abs(prob - want_prob) <= TOL, f"{t.relation}: p {prob} != {want_prob}"
        assert text == answer_text(model, ids), f"{t.relation}: {text!r} != {answer_text(model, ids)!r}"


def test_batched_probes_equal_one_by_one_and_reuse_the_examples(gemma: larql.Model) -> None:
    check_same(gemma, "France")  # fills the kept caches (or reuses an earlier test's)
    t = TEMPLATES[0]
    ids = gemma.tokenize(probe_prompt(t, "Japan"))
    _, rest = gemma.prefixes.start(gemma, ("probe", t.template), ids)
    assert 1 <= len(rest) <= 4 < len(ids), f"{len(rest)} of {len(ids)} ids left to run: the examples were not reused"
    check_same(gemma, "Japan")  # computed from the kept examples
    check_same(gemma, "Germany")  # Germany is one of the examples: another prefix, still right


def test_probe_edges_keep_what_clears_the_bar(gemma: larql.Model) -> None:
    every = probe_candidates(gemma, "Spain")  # every answer decoded in full
    shown = probe_edges(gemma, "Spain")  # answers under the bar stop at their first token
    want = sorted((e for e in every if e.score >= MIN_PROB), key=lambda e: -e.score)
    assert [(e.label, e.target) for e in shown] == [(e.label, e.target) for e in want]
    assert np.allclose([e.score for e in shown], [e.score for e in want], atol=TOL)
    assert any(e.label == "capital" and e.target == "Madrid" for e in shown)


def test_probes_of_many_entities_batched_equal_each_alone(gemma: larql.Model) -> None:
    """An INSERT of hundreds of subjects probes them together: the same edges as one entity at a time."""
    entities = ["Spain", "Kenya", "Zebrador", "Germany"]  # a fictional one, and one of the examples
    many = probe_edges_many(gemma, entities)
    for entity, got in zip(entities, many):
        want = probe_edges(gemma, entity)
        assert [(e.label, e.target) for e in got] == [(e.label, e.target) for e in want]
        assert np.allclose([e.score for e in got], [e.score for e in want], atol=TOL)
    assert any(e.label == "capital" and e.target == "Nairobi" for e in many[1])


def test_a_first_batch_runs_each_templates_examples_once(gemma: larql.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing kept, a batch first runs the prefix each template's prompts share (its worked
    examples) once, then every prompt its own few tokens: the same edges as each entity alone."""
    fresh = larql.load("gemma3-270m")  # no probe kept yet
    runs: list[list[int]] = []
    run = fresh.next_top1_batch
    monkeypatch.setattr(fresh, "next_top1_batch",
                        lambda batch, caches=None: runs.append([len(b) for b in batch]) or run(batch, caches))
    entities = ["Spain", "Kenya", "Zebrador"]
    many = probe_edges_many(fresh, entities)
    assert len(runs[0]) == len(TEMPLATES) and sum(runs[0]) >= 120  # the examples, once a template
    full = sum(len(fresh.tokenize(probe_prompt(t, e))) for e in entities for t in TEMPLATES)
    assert len(runs[1]) == len(TEMPLATES) * len(entities) and sum(runs[1]) <= full / 3  # then each prompt's tail
    for entity, got in zip(entities, many):
        want = probe_edges(gemma, entity)
        assert [(e.label, e.target) for e in got] == [(e.label, e.target) for e in want]
        assert np.allclose([e.score for e in got], [e.score for e in want], atol=TOL)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> larql.Model:
    spec = TinySpec(arch="llama")
    path = tmp_path_factory.mktemp("prefix") / "q8.gguf"
    write_gguf(path, spec, hf_weights(spec, seed=11))
    return larql.load(path)


class Relayed(FFN):
    """An FFN computed elsewhere (here: by the local one), as model/remote_ffn.py's RemoteFFN is."""

    def __init__(self, local: FFN) -> None:
        self.local = local

    def __call__(self, i: int, h: np.ndarray, hooks: HookFns | None, start: int) -> np.ndarray:
        return self.local(i, h, hooks, start)


def test_kept_caches_are_dropped_when_the_edits_change(tiny_model: larql.Model) -> None:
    c = tiny_model.config
    overlay = PatchOverlay(c.n_layers, c.ffn, c.hidden)
    m = tiny_model.with_edits(OverlayEdits(overlay))
    prompt, other = [5, 71, 72, 3, 200, 9, 9, 44], [5, 71, 72, 3, 200, 17, 4]
    store = PrefixCache()
    cache, rest = store.start(m, "k", prompt)
    assert rest == prompt  # nothing kept yet
    m.next_logits(rest, cache)
    store.keep(m, "k", prompt, cache)
    cache, rest = store.start(m, "k", other)
    assert rest == [17, 4] and cache.length == 5
    assert np.abs(m.next_logits(rest, cache) - m.next_logits(other)).max() <= TOL * 10
    rng = np.random.default_rng(0)
    overlay.set(1, 3, FeatureOverride(gate=rng.standard_normal(c.hidden).astype(np.float32) * 4))
    cache, rest = store.start(m, "k", other)
    assert rest == other and cache.length == 0  # the edit changed every later position's keys
    # a model whose FFN is replaced cannot say what it computes: nothing is kept
    wrapped = tiny_model.with_ffn(Relayed)
    assert wrapped.revision() is None and tiny_model.revision() == ()
    store.keep(wrapped, "w", prompt, wrapped.new_cache())
    assert store.start(wrapped, "w", prompt)[1] == prompt


def test_fork_copies_only_the_prefix(tiny_model: larql.Model) -> None:
    cache = tiny_model.new_cache(8)
    tiny_model.next_logits([5, 71, 72, 3], cache)
    copy = fork(cache, 2, 10)
    assert copy.length == 2 and copy.capacity >= 10
    assert np.array_equal(copy.k[1][:, :2], cache.k[1][:, :2]) and not copy.k[1][:, 2:].any()
    copy.k[1][:, :2] = 0  # a copy, not a view
    assert cache.k[1][:, :2].any()
