"""Batched forward passes: `forward_batch` and `next_logits_batch` against the same prompts run one
by one, on both bundled models and every tiny architecture (sliding windows, soft-caps, learned
positions, experts). The reference is the one-by-one pass; a batch packs rows differently, so the
weight products can take another kernel (BLAS on dequantized blocks instead of the small-batch
kernel) and the comparison is to float rounding: max |batch - alone| / max |alone| <= 1e-5, and the
same top-1 token at every position."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import larql
from larql.errors import ContextLengthError, ModelError
from tests.unit.model.test_ffn import Edits

REFS = Path(__file__).resolve().parents[1] / "golden" / "architectures"
ARCHITECTURES = sorted(p.name for p in REFS.iterdir() if p.is_dir())
TOL = 1e-5
PROMPTS = (
    "The capital of France is",
    "Hi",
    "One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen",
    "The Eiffel Tower is in the city of",
)


def worst(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def check_batch(m: larql.Model, batch: list[list[int]]) -> None:
    alone = [m.forward(ids) for ids in batch]
    together = m.forward_batch(batch)
    assert len(together) == len(batch)
    for b, (got, want) in enumerate(zip(together, alone)):
        assert got.shape == want.shape, f"sequence {b}: shape {got.shape} != {want.shape}"
        assert worst(got, want) <= TOL, f"sequence {b}: relative difference {worst(got, want):.2e}"
        assert np.array_equal(got.argmax(-1), want.argmax(-1)), f"sequence {b}: top-1 differs"
    last = m.next_logits_batch(batch)
    assert last.shape == (len(batch), m.vocab_size)
    for b, want in enumerate(alone):
        assert worst(last[b], want[-1]) <= TOL, f"next_logits_batch row {b}"


def test_batch_equals_one_by_one_on_the_bundled_models(real_model: larql.Model) -> None:
    # lengths on both sides of the small-batch kernels' 16 rows, and a single token
    batch = [real_model.tokenize(p) for p in PROMPTS]
    assert min(map(len, batch)) <= 3 and max(map(len, batch)) > 16
    check_batch(real_model, batch)
    check_batch(real_model, batch[:1])  # a batch of one is the plain pass


def test_batched_greedy_continuation_equals_one_by_one(real_model: larql.Model) -> None:
    """Caches of different lengths stepped together: each sequence's tokens and logits are its own."""
    m = real_model
    batch = [m.tokenize(p) for p in PROMPTS]
    steps = 4
    caches = [m.new_cache(len(ids) + steps) for ids in batch]
    logits = m.next_logits_batch(batch, caches)
    tokens: list[list[int]] = [[] for _ in batch]
    for _ in range(steps):
        nxt = logits.argmax(-1)
        for b, t in enumerate(nxt):
            tokens[b].append(int(t))
        logits = m.next_logits_batch([[int(t)] for t in nxt], caches)
    for b, ids in enumerate(batch):
        assert caches[b].length == len(ids) + steps
        want = m.generate(ids, max_new_tokens=steps, stop_at_eos=False).ids
        assert tokens[b] == want, f"sequence {b}: {tokens[b]} != {want}"
        alone = m.next_logits(ids + want)
        assert worst(logits[b], alone) <= TOL, f"sequence {b}: last step differs"


def test_next_top1_batch_is_the_argmax_of_next_logits_batch(real_model: larql.Model) -> None:
    """The greedy token of each sequence exactly as next_logits_batch's argmax, and its log-probability,
    from a batch past the small-batch kernels' 16 rows (the lm_head in chunks) and from one row."""
    m = real_model
    batch = [m.tokenize(p) for p in PROMPTS] * 4
    for part in (batch, batch[:1]):
        logits = m.next_logits_batch(part).astype(np.float64)
        ids, logp = m.next_top1_batch(part)
        assert np.array_equal(ids, logits.argmax(-1))
        shifted = logits - logits.max(-1, keepdims=True)
        want = -np.log(np.exp(shifted).sum(-1))  # log p of the top token
        np.testing.assert_allclose(logp, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_batch_equals_one_by_one_on_every_architecture(arch: str) -> None:
    m = larql.load(REFS / arch)
    ref = np.load(REFS / f"{arch}.npz")
    p0, p1 = ref["p0.ids"].tolist(), ref["p1.ids"].tolist()  # 62 and 15 tokens: past every window
    check_batch(m, [p0, p1, p0[:1], p1[:7]])


def test_ffn_edits_apply_to_every_sequence_of_a_batch(tiny: dict) -> None:
    m = larql.load(tiny["root"] / "q8.gguf")
    rng = np.random.default_rng(3)
    h = m.config.hidden
    edited = m.with_edits(Edits(overrides={1: {2: (rng.standard_normal(h).astype(np.float32), None, None)}},
                                gone={0: {1, 5}}, top_k=6))
    check_batch(edited, [[5, 71, 72, 3, 200, 9, 9, 44], [3, 1], list(range(1, 30))])
    # and the edits matter: the edited model differs from the plain one
    assert worst(edited.forward([5, 71, 72]), m.forward([5, 71, 72])) > 1e-3


def test_bad_batches_are_refused_in_one_line(gemma: larql.Model) -> None:
    with pytest.raises(ModelError, match="empty batch"):
        gemma.forward_batch([])
    with pytest.raises(ModelError, match="no tokens"):
        gemma.forward_batch([[2, 651], []])
    with pytest.raises(ModelError, match="outside the vocabulary"):
        gemma.next_logits_batch([[2, 651], [2, gemma.vocab_size]])
    with pytest.raises(ModelError, match="2 sequences but 1 caches"):
        gemma.next_logits_batch([[2], [2]], [gemma.new_cache()])
    with pytest.raises(ContextLengthError):
        gemma.forward_batch([[2], [2] * (gemma.config.context_length + 1)])
