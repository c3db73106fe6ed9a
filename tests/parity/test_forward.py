"""Forward pass against HF transformers float32 (weights dequantized from the same GGUF)."""

from __future__ import annotations

import numpy as np
import pytest

import larql
from larql.model.generate import log_softmax
from tests.conftest import ACTIVATION_PROMPTS, GOLDEN, LOGITS_PROMPT, golden, rel_err


def test_top1_and_logprobs_match_hf(real_model: larql.Model) -> None:
    diffs = []
    for p in golden(real_model.name, "hf"):
        logits = real_model.next_logits(p["ids"])
        assert int(np.argmax(logits)) == p["top5_ids"][0], p["prompt"]
        logp = log_softmax(logits)
        diffs.append(np.abs(logp[p["top5_ids"]] - np.array(p["top5_logprobs"])).mean())
    assert float(np.mean(diffs)) <= 0.01 and max(diffs) <= 0.01, f"mean |dlogp| {np.mean(diffs):.2e}, max {max(diffs):.2e}"


def test_full_forward_logits_match_last_position(real_model: larql.Model) -> None:
    z = np.load(GOLDEN / f"{real_model.name}.hf.npz")
    ids = golden(real_model.name, "hf")[LOGITS_PROMPT]["ids"]
    all_logits = real_model.forward(ids)
    assert all_logits.shape == (len(ids), real_model.vocab_size) and all_logits.dtype == np.float32
    assert rel_err(all_logits[-1], z[f"p{LOGITS_PROMPT}.logits_last"]) <= 1e-4


def test_per_layer_activations_match_hf(real_model: larql.Model) -> None:
    z = np.load(GOLDEN / f"{real_model.name}.hf.npz")
    n_layers = real_model.config.n_layers
    worst = 0.0
    for i, p in enumerate(golden(real_model.name, "hf")[:ACTIVATION_PROMPTS]):
        captured: dict[str, np.ndarray] = {}

        def keep(x: np.ndarray, name: str, captured: dict[str, np.ndarray] = captured) -> None:
            captured[name] = x.copy()

        names = ["hook_embed"] + [f"blocks.{layer}.{kind}" for layer in range(n_layers)
                                  for kind in ("hook_resid_post", "hook_attn_out", "hook_mlp_out")]
        real_model.forward(p["ids"], hooks={n: keep for n in names})
        assert rel_err(captured["hook_embed"], z[f"p{i}.hook_embed"]) <= 1e-6
        for layer in range(n_layers):
            for ours, theirs in (("hook_resid_post", "hook_resid_post"), ("hook_attn_out", "hook_attn_out"),
                                 ("hook_mlp_out", "hook_mlp_post")):
                err = rel_err(captured[f"blocks.{layer}.{ours}"], z[f"p{i}.blocks.{layer}.{theirs}"])
                worst = max(worst, err)
                assert err <= 1e-4, f"prompt {i} layer {layer} {ours}: relative error {err:.2e}"


@pytest.mark.slow
def test_greedy_24_tokens_match_hf(real_model: larql.Model) -> None:
    for p in golden(real_model.name, "hf"):
        # HF stops at EOS (some SmolLM2 answers end early, with the EOS token included)
        gen = real_model.generate(p["prompt"], max_new_tokens=24)
        assert gen.ids == p["greedy24_ids"], p["prompt"]
        assert gen.finish_reason == ("length" if len(gen.ids) == 24 else "stop")
        assert gen.text == real_model.detokenize(p["greedy24_ids"])


def test_run_with_cache_matches_hf_every_array_kind(real_model: larql.Model) -> None:
    z = np.load(GOLDEN / f"{real_model.name}.hf.npz")
    ours_to_hf = {"hook_attn_out": "hook_attn_out", "hook_mlp_out": "hook_mlp_post", "hook_resid_post": "hook_resid_post"}
    for i, p in enumerate(golden(real_model.name, "hf")[:ACTIVATION_PROMPTS]):
        logits, cache = real_model.run_with_cache(p["ids"])
        if i == LOGITS_PROMPT:  # the references keep one full vocabulary row
            assert rel_err(logits[-1], z[f"p{i}.logits_last"]) <= 1e-4
        assert rel_err(cache["hook_embed"], z[f"p{i}.hook_embed"]) <= 1e-4
        for layer in range(real_model.config.n_layers):
            for ours, theirs in ours_to_hf.items():
                err = rel_err(cache[f"blocks.{layer}.{ours}"], z[f"p{i}.blocks.{layer}.{theirs}"])
                assert err <= 1e-4, f"prompt {i} layer {layer} {ours}: {err:.2e}"
