"""The edit evaluation's measures on Gemma 3 270M against independent references: held-out
perplexity against exp(mean NLL) from full logits, and the WILD continuations against `generate`."""

from __future__ import annotations

import math

import numpy as np

from larql.edit.measure.generation import greedy_continuations
from larql.edit.measure.perplexity import held_out_text, perplexity, windows
from larql.model.generate import log_softmax


def test_perplexity_is_exp_mean_nll_of_full_logits(gemma) -> None:
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


def test_greedy_continuations_are_generate(gemma) -> None:
    prompts = ["The capital of France is", "Bees make", "The Mona Lisa was painted by"]
    got = greedy_continuations(gemma, prompts, max_new_tokens=6, batch=2)  # two batches
    assert got == [gemma.generate(p, max_new_tokens=6).text for p in prompts]
