"""Hook names, interventions, run_with_cache, hooks through the KV cache, and zero cost when unused."""

from __future__ import annotations

import numpy as np
import pytest

import larql
from larql.errors import ModelError
from larql.model import ffn as ffn_module
from larql.model import forward as forward_module
from larql.model.hooks import Add, Knockout, Replace, Scale, Zero, all_hook_names, hook_name
from tests.conftest import rel_err

IDS = [5, 71, 72, 3, 200, 9, 9, 44]


@pytest.fixture(scope="module")
def m(tiny: dict) -> larql.Model:
    return larql.load(tiny["root"] / "f32.gguf")


def test_names_parse_and_unknown_names_suggest(m: larql.Model) -> None:
    assert str(hook_name("blocks.1.attn.hook_pattern", 2)) == "blocks.1.attn.hook_pattern"
    assert hook_name("hook_embed", 2).layer is None
    with pytest.raises(ModelError, match=r"unknown hook point 'blocks.1.hook_resid_pots'; did you mean blocks.1.hook_resid_post"):
        hook_name("blocks.1.hook_resid_pots", 2)
    with pytest.raises(ModelError, match="layer 5 is out of range"):
        hook_name("blocks.5.hook_resid_post", 2)
    with pytest.raises(ModelError, match="unknown hook point"):
        m.forward(IDS, hooks={"resid": Zero()})


def test_run_with_cache_shapes_and_consistency(m: larql.Model) -> None:
    logits, cache = m.run_with_cache(IDS)
    c = m.config
    assert set(cache) == set(m.hook_names()) == set(all_hook_names(c.n_layers)) - {
        f"blocks.{i}.mlp.{kind}" for i in range(c.n_layers)
        for kind in ("hook_router", "hook_expert_weights", "hook_expert_indices")}
    t = len(IDS)
    assert cache["blocks.0.attn.hook_q"].shape == (t, c.n_heads, c.head_dim)
    assert cache["blocks.1.attn.hook_pattern"].shape == (t, c.n_heads, t)
    assert np.allclose(cache["blocks.1.attn.hook_pattern"].sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(cache["blocks.1.attn.hook_pattern"][:, 0], 1) == 0)  # causal
    assert np.array_equal(logits, m.forward(IDS))
    # the residual stream adds up: resid_post(L) = resid_pre(L+1)
    assert np.array_equal(cache["blocks.0.hook_resid_post"], cache["blocks.1.hook_resid_pre"])


def test_interventions(m: larql.Model) -> None:
    base = m.forward(IDS)
    _, cache = m.run_with_cache(IDS, names=["blocks.0.hook_resid_post"])
    resid = cache["blocks.0.hook_resid_post"]
    # Replace at one position changes only that position and later ones
    steer = np.ones(m.config.hidden, np.float32)
    replaced = m.forward(IDS, hooks={"blocks.0.hook_resid_post": Replace(resid[2] + steer, positions=2)})
    assert np.array_equal(replaced[:2], base[:2]) and not np.allclose(replaced[2], base[2])
    added = m.forward(IDS, hooks={"blocks.0.hook_resid_post": Add(steer, positions=[2])})
    assert np.allclose(added, replaced, atol=1e-5)
    assert np.allclose(m.forward(IDS, hooks={"blocks.1.hook_mlp_out": Scale(1.0)}), base)
    _, zc = m.run_with_cache(IDS, names=["blocks.1.hook_mlp_out"], hooks={"blocks.1.hook_mlp_out": Zero(positions=(0, 1))})
    assert np.all(zc["blocks.1.hook_mlp_out"][:2] == 0) and np.any(zc["blocks.1.hook_mlp_out"][2:] != 0)
    with pytest.raises(ModelError, match=r"value of shape \[3\] does not fit an activation of shape \[8, 64\]"):
        m.forward(IDS, hooks={"blocks.0.hook_resid_post": Add(np.zeros(3, np.float32))})
    with pytest.raises(ModelError, match="Knockout applies to attn.hook_scores"):
        m.forward(IDS, hooks={"blocks.0.hook_resid_post": Knockout()})


def test_knockout_removes_attention_edges(m: larql.Model) -> None:
    _, cache = m.run_with_cache(IDS, names=["blocks.0.attn.hook_pattern"],
                                hooks={"blocks.0.attn.hook_scores": Knockout(heads=[1], keys=[0], queries=range(1, 8))})
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert np.all(pattern[1:, 1, 0] == 0) and np.all(pattern[1:4, 0, 0] > 0)  # (gemma3: a window of 4)
    assert np.allclose(pattern.sum(-1), 1.0, atol=1e-5)


def test_hooks_through_the_kv_cache_match_a_recompute(m: larql.Model) -> None:
    steer = np.full(m.config.hidden, 0.5, np.float32)
    spec = {"blocks.0.hook_resid_post": Add(steer)}
    seen: list[np.ndarray] = []
    spec_capture = {**spec, "blocks.1.hook_mlp_out": lambda x, name: seen.append(x.copy())}
    gen = m.generate(IDS[:4], max_new_tokens=5, stop_at_eos=False, hooks=spec_capture)
    full = IDS[:4] + gen.ids
    logits, cache = m.run_with_cache(full[:-1], names=["blocks.1.hook_mlp_out"], hooks=spec)
    assert gen.ids == [int(np.argmax(logits[i])) for i in range(3, len(full) - 1)]
    assert rel_err(np.concatenate(seen), cache["blocks.1.hook_mlp_out"]) <= 1e-5


def test_no_hooks_means_no_hook_calls(m: larql.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object) -> None:
        raise AssertionError("a hook point ran with no hooks set")

    monkeypatch.setattr(forward_module, "run_hook", boom)
    monkeypatch.setattr(ffn_module, "run_hook", boom)
    m.forward(IDS)
    m.generate(IDS[:3], max_new_tokens=3, stop_at_eos=False)


def test_sparse_ffn_top_k(m: larql.Model) -> None:
    from larql.model.hooks import TopK, sparse_ffn

    assert np.array_equal(m.forward(IDS, hooks=sparse_ffn(m.config.n_layers, m.config.ffn)), m.forward(IDS))
    _, cache = m.run_with_cache(IDS, names=["blocks.1.mlp.hook_post"], hooks={"blocks.1.mlp.hook_post": TopK(3)})
    kept = cache["blocks.1.mlp.hook_post"]
    assert np.all((kept != 0).sum(axis=1) == 3)
    _, dense = m.run_with_cache(IDS, names=["blocks.1.mlp.hook_post"])
    full = dense["blocks.1.mlp.hook_post"]
    for row, k_row in zip(full, kept):  # the survivors are the three largest |x|, unchanged
        top = np.argsort(-np.abs(row))[:3]
        assert set(np.flatnonzero(k_row)) == set(top) and np.allclose(k_row[top], row[top])
    assert not np.allclose(m.forward(IDS, hooks=sparse_ffn(m.config.n_layers, 3)), m.forward(IDS))
