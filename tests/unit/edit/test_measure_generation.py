"""The edit evaluation's shared greedy continuations and its softmax arithmetic on a tiny model:
GEN read from the prompt's WILD continuation is GEN from its own generation, and the float32
negative log-likelihoods are the float64 ones."""

from __future__ import annotations

import numpy as np
import pytest

from larql.edit.measure.evaluate import GEN_TOKENS, EditRecord, score_records
from larql.edit.measure.generation import WILD_TOKENS, greedy_continuations, greedy_ids
from larql.edit.measure.scoring import Scorer, nll
from larql.edit.state.view import edit_vindex
from larql.model.model import Model
from tests.synthetic import TinySpec, tiny_vindex

PROMPTS = ["zeta is", "The capital of zeta is", "Colour of", "Q: what? A:", "ab"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Model:
    vx = tiny_vindex(tmp_path_factory.mktemp("measure"), TinySpec("gemma3", n_layers=2, ffn=64), seed=3)
    return edit_vindex(vx).model()


def test_batched_continuations_are_one_by_one_generation(model: Model) -> None:
    want = [model.generate(p, max_new_tokens=WILD_TOKENS).text for p in PROMPTS]
    assert greedy_continuations(model, PROMPTS, batch=2) == want  # batches of 2 and of all at once
    assert greedy_continuations(model, PROMPTS) == want
    assert [len(ids) for ids in greedy_ids(model, PROMPTS)] == [
        len(g) for g in model.generate_batch([model.tokenize(p) for p in PROMPTS], WILD_TOKENS)]


def test_gen_reads_the_first_gen_tokens_of_the_wild_continuation(model: Model) -> None:
    assert GEN_TOKENS < WILD_TOKENS
    # the byte-level tokenizer: a token is a character. One target inside the first GEN_TOKENS
    # characters (GEN 1), one the whole WILD continuation, longer than GEN's (GEN 0, gen_ES 1)
    old = [model.detokenize(g) for g in model.generate_batch([model.tokenize(p) for p in PROMPTS], GEN_TOKENS)]
    full = greedy_continuations(model, PROMPTS)
    inside, whole = old[0][1:4], full[1]
    assert inside.strip() and len(whole.strip()) > GEN_TOKENS
    recs = [EditRecord("zeta", PROMPTS[0], inside), EditRecord("zeta", PROMPTS[1], whole)]
    got = score_records(model, recs, ())
    assert [s.gen for s in got] == [float(r.target_new.strip().lower() in g.lower()) for r, g in zip(recs, old)]
    assert [s.gen for s in got] == [1.0, 0.0] and got[1].gen_es == 1.0


def test_float32_nll_is_the_float64_log_softmax() -> None:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((6, 5000)) * 4).astype(np.float32)
    logits[2, 7] = 40.0  # one row with a dominant logit, one wanted token far below the top
    want = np.array([0, 4999, 7, 11, 3, 2500])
    z = logits.astype(np.float64)
    ref = np.log(np.exp(z - z.max(axis=1, keepdims=True)).sum(axis=1)) + z.max(axis=1) - z[np.arange(6), want]
    kept = logits.copy()
    np.testing.assert_allclose(nll(logits, want), ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(logits, kept)  # left alone without overwrite
    np.testing.assert_allclose(nll(logits, want, overwrite=True), ref, rtol=1e-6, atol=1e-6)


def test_scorer_continues_its_prompts_as_greedy_generation(model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    import larql.edit.measure.scoring as scoring

    monkeypatch.setattr(scoring, "BATCH", 2)  # continuations stepped in several batches, one left over
    monkeypatch.setattr(scoring, "BATCH_ROWS", 4)  # and started from several prompt passes
    sc = Scorer(model)
    asked = [*PROMPTS, PROMPTS[0]]  # one asked twice: continued once
    sc.prefetch([(PROMPTS[1], "x"), (PROMPTS[2], "blue")], greedy=asked)
    assert [sc.continuation(p) for p in asked] == [*greedy_ids(model, PROMPTS), greedy_ids(model, PROMPTS[:1])[0]]
    assert sc.token_logps(PROMPTS[1], "x")  # the pairs scored beside them
