"""Greedy decoding's lm_head shortcut (QuantMatrix.argmax_matvec) on the bundled models: every step's
token is np.argmax of the full logits, and generate() gives the ids the full-logit loop gives."""

from __future__ import annotations

import numpy as np

import larql
from larql.model.segments import Segment
from larql.quant import argmax


def test_next_token_is_the_argmax_of_next_logits(real_model: larql.Model) -> None:
    m = real_model
    ids = m.tokenize("The history of the city begins with a small settlement on the river, where")
    full, fast = m.new_cache(64), m.new_cache(64)
    logits = m.next_logits(ids, full)
    tok = m.next_token(ids, fast)
    for _ in range(12):
        assert tok == int(np.argmax(logits))
        logits = m.next_logits([tok], full)
        tok = m.next_token([tok], fast)
    assert full.length == fast.length
    for a, b in zip(full.k, fast.k):
        assert np.array_equal(a[:, :full.length], b[:, :fast.length])


def test_generate_matches_the_full_logit_loop(real_model: larql.Model) -> None:
    m = real_model
    ids = m.tokenize("Paris is the capital of")
    cache = m.new_cache(32)
    want, logits = [], m.next_logits(ids, cache)
    for _ in range(10):
        want.append(int(np.argmax(logits)))
        logits = m.next_logits([want[-1]], cache)
    assert m.generate(ids, max_new_tokens=10, stop_at_eos=False).ids == want


def test_few_rows_are_rescored(gemma: larql.Model) -> None:
    """On Gemma 3's 262,144-row lm_head the bound leaves a handful of candidates (1-3 measured)."""
    if not argmax.HAVE_VNNI:
        return
    ids = gemma.tokenize("The capital of France is")
    cache = gemma.new_cache(16)
    x = gemma._forward.run([Segment(0, len(ids), cache, 0)], np.asarray(ids), None)[-1]  # (hidden,)
    h = gemma._forward.final_norm(x, None, 0)
    out = gemma.weights.output
    rows = argmax.candidate_rows(out.raw, argmax.row_norms(out.raw), h)
    assert rows is not None and 1 <= len(rows) <= 50
