"""Tiny seeded models written as GGUF and as safetensors: loaders, forward pass, KV cache, sampling."""

from __future__ import annotations

import numpy as np
import pytest

import larql
from tests.conftest import rel_err
from tests.synthetic import reference_logits

IDS = [5, 71, 72, 3, 200, 9, 9, 44, 120, 17]  # longer than the gemma3 sliding window of 4


def test_gguf_f32_matches_reference(tiny: dict) -> None:
    m = larql.load(tiny["root"] / "f32.gguf")
    expected = reference_logits(tiny["spec"], tiny["f32_held"], IDS)
    assert rel_err(m.forward(IDS), expected) <= 1e-5


def test_gguf_q8_0_matches_reference_over_its_dequantized_weights(tiny: dict) -> None:
    m = larql.load(tiny["root"] / "q8.gguf")
    assert m.weights.layers[0].q.qtype.name == "Q8_0"
    expected = reference_logits(tiny["spec"], tiny["q8_held"], IDS)
    assert rel_err(m.forward(IDS), expected) <= 1e-5


def test_hf_directory_matches_reference_and_gguf(tiny: dict) -> None:
    hf = larql.load(tiny["root"] / "hf")
    gg = larql.load(tiny["root"] / "f32.gguf")
    assert hf.config.rope_interleaved is False
    assert gg.config.rope_interleaved is (tiny["spec"].arch == "llama")
    expected = reference_logits(tiny["spec"], tiny["weights"], IDS)
    assert rel_err(hf.forward(IDS), expected) <= 1e-5
    assert rel_err(hf.forward(IDS), gg.forward(IDS)) <= 1e-5


def test_kv_cache_decode_equals_full_forward(tiny: dict) -> None:
    m = larql.load(tiny["root"] / "q8.gguf")
    full = m.forward(IDS)
    cache = m.new_cache(capacity=2)  # forces the cache to grow
    step_logits = [m.next_logits(IDS[:3], cache)]
    for tok in IDS[3:]:
        step_logits.append(m.next_logits([tok], cache))
    assert cache.length == len(IDS)
    assert rel_err(np.stack(step_logits), full[2:]) <= 1e-5


def test_hook_points_fire_in_order_and_can_replace(tiny: dict) -> None:
    m = larql.load(tiny["root"] / "f32.gguf")
    seen: list[str] = []
    names = ["hook_embed", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_q", "blocks.0.hook_attn_out",
             "blocks.0.hook_resid_mid", "blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post",
             "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post", "hook_final_norm"]
    m.forward(IDS, hooks={n: (lambda x, name: seen.append(name)) for n in names})
    assert seen == names
    zeroed = m.forward(IDS, hooks={"blocks.1.hook_mlp_out": lambda x, name: np.zeros_like(x)})
    assert not np.allclose(zeroed, m.forward(IDS))


def test_generation_greedy_and_sampling(tiny: dict) -> None:
    m = larql.load(tiny["root"] / "q8.gguf")
    greedy = m.generate(IDS[:4], max_new_tokens=6, stop_at_eos=False)
    assert len(greedy.ids) == 6 and greedy.text == m.detokenize(greedy.ids)
    # greedy is argmax of the full forward pass at each step
    seq = list(IDS[:4])
    for tok in greedy.ids:
        assert tok == int(np.argmax(m.forward(seq)[-1]))
        seq.append(tok)
    assert m.generate(IDS[:4], max_new_tokens=6, temperature=1.0, top_k=1, stop_at_eos=False).ids == greedy.ids
    assert m.generate(IDS[:4], max_new_tokens=6, temperature=0.8, top_p=1e-6, stop_at_eos=False).ids == greedy.ids
    a = m.generate(IDS[:4], max_new_tokens=16, temperature=50.0, seed=3, stop_at_eos=False).ids
    b = m.generate(IDS[:4], max_new_tokens=16, temperature=50.0, seed=3, stop_at_eos=False).ids
    c = m.generate(IDS[:4], max_new_tokens=16, temperature=50.0, seed=4, stop_at_eos=False).ids
    assert a == b and a != c


def test_sampling_respects_top_k() -> None:
    from larql.model.generate import SamplingParams, sample

    logits = np.array([0.0, 5.0, 4.9, 4.8, -1.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    draws = {sample(logits, SamplingParams(temperature=5.0, top_k=2), rng) for _ in range(300)}
    assert draws == {1, 2}


def test_stream_yields_text_pieces(tiny: dict) -> None:
    m = larql.load(tiny["root"] / "hf")
    pieces = list(m.stream("hello", max_new_tokens=5, stop_at_eos=False))
    assert len(pieces) == 5
    assert "".join(p for _, p in pieces) == m.detokenize([t for t, _ in pieces]).rstrip("\ufffd")


def test_capture_batch_equals_run_with_cache_per_prompt(tiny: dict) -> None:
    """Editing reads keys of hundreds of short prompts in packed passes: each sequence's activations
    must be its own pass's, whatever else is packed beside it (lengths differ, one is a single token)."""
    from larql.errors import ModelError

    m = larql.load(tiny["root"] / "q8.gguf")
    batch = [IDS, IDS[:3], [7], IDS[::-1]]
    names = ["blocks.0.hook_resid_mid", "blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out"]
    got = m.capture_batch(batch, names)
    assert len(got) == len(batch)
    for ids, acts in zip(batch, got):
        _, want = m.run_with_cache(ids, names)
        for name in names:
            assert acts[name].shape == want[name].shape
            assert rel_err(acts[name], want[name]) <= 1e-5
    for bad in (["blocks.0.attn.hook_pattern"], ["hook_embed"]):
        with pytest.raises(ModelError, match="capture_batch"):
            m.capture_batch(batch, bad)
    # from the residual entering layer 1, read before: the same bits as the full pass
    entry = "blocks.1.hook_resid_pre"
    resid = [acts[entry] for acts in m.capture_batch(batch, [entry])]
    later = names[1:]
    for acts, want in zip(m.capture_batch(batch, later, 1, resid), got):
        for name in later:
            np.testing.assert_array_equal(acts[name], want[name])
    with pytest.raises(ModelError, match="a pass from layer 1 cannot read 'blocks.0.hook_resid_mid'"):
        m.capture_batch(batch, names, 1, resid)
    with pytest.raises(ModelError, match=f"one \\(len\\(ids\\), {m.config.hidden}\\) array per sequence"):
        m.capture_batch(batch, later, 1, resid[:2])
