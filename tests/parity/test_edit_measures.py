"""The edit evaluation's measures on Gemma 3 270M against independent references: held-out
perplexity against exp(mean NLL) from full logits, the WILD continuations against `generate`, and
the teacher-forced log-probabilities against float64 log-softmax rows."""

from __future__ import annotations

import math

import numpy as np

from larql.edit.measure.evaluate import GEN_TOKENS, EditRecord, score_records
from larql.edit.measure.generation import greedy_continuations, greedy_ids
from larql.edit.measure.perplexity import held_out_text, perplexity, windows
from larql.edit.measure.scoring import Scorer
from larql.model.generate import log_softmax
from larql.model.model import Model
from larql.model.targets import target_ids


def test_perplexity_is_exp_mean_nll_of_full_logits(gemma: Model) -> None:
    text = held_out_text()[:250]
    got = perplexity(gemma, text, window=32, piece=8)  # several windows, each in several cached pieces
    nlls = []
    ids = gemma.tokenizer.tok.encode(text, add_special_tokens=False).ids
    bos = [gemma.tokenizer.bos_id]
    for at in range(0, len(ids), 31):  # the reference: each window alone, all its logits at once
        w = bos + list(ids[at: at + 31])
        logp = np.stack([log_softmax(row, np.float64) for row in gemma.forward(w)])
        nlls += [-logp[t, w[t + 1]] for t in range(len(w) - 1)]
    assert got.tokens == len(nlls) == len(ids)
    assert math.isclose(got.nll, float(np.mean(nlls)), rel_tol=1e-4), (got.nll, np.mean(nlls))
    assert math.isclose(got.ppl, math.exp(float(np.mean(nlls))), rel_tol=1e-4)
    assert len(windows(gemma, text, 32)) > 1 and all(len(w) == 32 for w in windows(gemma, text, 32)[:-1])


def test_greedy_continuations_are_generate(gemma: Model) -> None:
    prompts = ["The capital of France is", "Bees make", "The Mona Lisa was painted by"]
    got = greedy_continuations(gemma, prompts, max_new_tokens=6, batch=2)  # two batches
    assert got == [gemma.generate(p, max_new_tokens=6).text for p in prompts]
    sc = Scorer(gemma)  # continued from the teacher-forced prompt passes, as score_records does
    sc.prefetch([(prompts[0], " Paris")], greedy=prompts, max_new_tokens=6)
    assert [sc.continuation(p) for p in prompts] == greedy_ids(gemma, prompts, max_new_tokens=6)


def test_scores_are_the_float64_softmax_and_gen_its_own_generation(gemma: Model) -> None:
    # the records' scores as computed before the WILD continuation served GEN and the softmax ran in
    # float32: GEN from its own 8-token generation, log-probabilities from float64 log-softmax rows
    recs = [EditRecord("gold", "The chemical symbol for gold is", " Au", target_true=" Ag"),
            EditRecord("bees", "Bees make", " honey"), EditRecord("Mona Lisa", "The Mona Lisa was painted by", " Picasso")]
    got = score_records(gemma, recs, ())
    gens = gemma.generate_batch([gemma.tokenize(r.prompt) for r in recs], GEN_TOKENS)
    assert [s.gen for s in got] == [float(r.target_new.strip().lower() in gemma.detokenize(g).lower())
                                    for r, g in zip(recs, gens)]
    assert [s.gen for s in got] == [1.0, 1.0, 0.0]
    sc = Scorer(gemma)
    for r in recs:
        prompt, target = gemma.tokenize(r.prompt), target_ids(gemma, r.target_new)
        rows = gemma.forward(prompt + target[:-1])[len(prompt) - 1:]  # the rows predicting each target token
        ref = [log_softmax(row, np.float64)[t] for row, t in zip(rows, target)]
        np.testing.assert_allclose([x for x, _ in sc.token_logps(sc.prompt(r.prompt), r.target_new)], ref, atol=2e-4)
