"""Interpretability primitives on a tiny model: each checked against a direct computation."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import larql
from larql.model import interp
from larql.model.generate import log_softmax
from larql.model.hooks import Add

IDS = [5, 71, 72, 3, 200, 9]


@pytest.fixture(scope="module")
def m(tiny: dict) -> larql.Model:
    return larql.load(tiny["root"] / "f32.gguf")


def test_logit_lens_of_the_last_layer_is_the_output(m: larql.Model) -> None:
    logits, cache = m.run_with_cache(IDS, names=[f"blocks.{m.config.n_layers - 1}.hook_resid_post"])
    lens = interp.logit_lens(m, cache[f"blocks.{m.config.n_layers - 1}.hook_resid_post"])
    assert np.allclose(lens, np.stack([log_softmax(r) for r in logits]), atol=1e-4)
    token = int(np.argmax(logits[-1]))
    assert interp.token_trajectory(m, IDS, token)[-1][0] == 1


def test_layer_attribution_adds_up(m: larql.Model) -> None:
    token = 17
    _, cache = m.run_with_cache(IDS, names=interp.residual_hook_names(range(m.config.n_layers)))
    parts = interp.layer_attribution(m, cache, token)
    assert parts.shape == (m.config.n_layers, 2)
    assert np.allclose(interp.layer_attribution(m, cache, token, layers=[1]), parts[1:2], rtol=1e-5)
    _, cache = m.run_with_cache(IDS, names=["hook_embed", f"blocks.{m.config.n_layers - 1}.hook_resid_post"])
    final = cache[f"blocks.{m.config.n_layers - 1}.hook_resid_post"][-1]
    total = interp.direct_logit_attribution(m, final - cache["hook_embed"][-1], token)
    assert parts.sum() == pytest.approx(total, rel=1e-4, abs=1e-4)


def test_embedding_neighbours_find_the_token_itself(m: larql.Model) -> None:
    vec = m.weights.token_embd.row(42)
    assert interp.embedding_neighbours(m, vec, k=3)[0] == (42, pytest.approx(1.0, abs=1e-5))


def test_patching(m: larql.Model) -> None:
    donor, recipient = [5, 80, 81, 3, 200, 9], IDS
    last = m.config.n_layers - 1
    patched = interp.patch_activation(m, donor, recipient, last, len(IDS) - 1)
    assert np.allclose(patched[-1], m.forward(donor)[-1], atol=1e-4)  # the last residual is everything
    token = int(np.argmax(m.forward(donor)[-1]))
    sweep = interp.patching_sweep(m, donor, recipient, token)
    assert sweep.shape == (m.config.n_layers, len(IDS))
    assert sweep[last, len(IDS) - 1] == pytest.approx(
        log_softmax(m.forward(donor)[-1])[token] - log_softmax(m.forward(recipient)[-1])[token], abs=1e-4)
    assert np.allclose(sweep[:, :1], 0, atol=1e-5)  # the prompts share their first token


def test_steering_and_kv_surgery(m: larql.Model) -> None:
    v = interp.steering_vector(m, ["abc", "abd"], ["xyz", "xyw"], layer=0)
    assert v.shape == (m.config.hidden,) and np.linalg.norm(v) > 0
    steered = m.generate(IDS[:3], max_new_tokens=4, stop_at_eos=False, hooks={"blocks.0.hook_resid_post": Add(5 * v)})
    assert len(steered.ids) == 4
    donor, recipient = m.new_cache(), m.new_cache()
    m.next_logits([5, 80, 81], donor)
    m.next_logits(IDS[:3], recipient)
    interp.copy_kv(recipient, donor)
    assert np.allclose(m.next_logits([3], recipient), m.next_logits([5, 80, 81, 3]), atol=1e-5)


def test_top_tokens_is_a_stable_argsort() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(5000).astype(np.float32)
    logits[[10, 20, 30, 4000]] = 9.0  # ties at the top, across the boundary of k = 3
    for k in (1, 3, 4, 50, 5000, 6000):
        assert np.array_equal(interp.top_tokens(logits, k), np.argsort(-logits, kind="stable")[:k])
    assert interp.top_tokens(logits, 0).size == 0


def test_kl_and_rank() -> None:
    p = log_softmax(np.array([2.0, 1.0, 0.0], np.float32))
    q = log_softmax(np.array([0.0, 1.0, 2.0], np.float32))
    assert interp.kl(p, p) == pytest.approx(0.0, abs=1e-7)
    assert interp.kl(p, q) == pytest.approx(float(np.sum(np.exp(p) * (p - q))))
    assert interp.kl(p, q) > 0 and [interp.rank_of(p, t) for t in range(3)] == [1, 2, 3]


def test_target_token_ids(m: larql.Model) -> None:
    from larql.errors import EmptyTargetError, LarqlError

    ids = interp.target_token_ids(m, "Paris")  # the tiny byte-level tokenizer: one token per byte
    assert ids == m.tokenizer.tok.encode(" Paris", add_special_tokens=False).ids and len(ids) == 6
    assert interp.target_token_ids(m, " Paris") == ids  # a leading space is kept, not doubled
    assert interp.first_target_token(m, "Paris") == ids[0]

    class Nothing:  # a tokenizer that drops the text (as SentencePiece can drop a lone space)
        def encode(self, text: str, add_special_tokens: bool = False) -> SimpleNamespace:
            return SimpleNamespace(ids=[])

    empty = SimpleNamespace(tokenizer=SimpleNamespace(tok=Nothing()))
    with pytest.raises(EmptyTargetError, match="target '' tokenizes to nothing") as err:
        interp.first_target_token(empty, "")  # type: ignore[arg-type]
    assert isinstance(err.value, LarqlError)
