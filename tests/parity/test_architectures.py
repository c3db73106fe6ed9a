"""Every architecture larql runs, against HF transformers: tiny random-weight models that
transformers built and ran (tools/make_tiny_references.py), loaded by larql from their safetensors.

Per architecture and prompt: logits at every position within 1e-4 relative error and the same
top-1 token everywhere, the residual entering layer 0 and after every layer within 1e-4, and
layer 0's `attn.hook_q` equal to the q projection before RoPE (TransformerLens's meaning). The
references are committed files; no torch is needed here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import larql
from tests.conftest import rel_err

REFS = Path(__file__).resolve().parents[1] / "golden" / "architectures"
ARCHITECTURES = sorted(p.name for p in REFS.iterdir() if p.is_dir())
TOL = 1e-4


def measure(arch: str) -> dict[str, float]:
    """Worst relative errors of larql against the reference: logits and per-layer residuals,
    over every prompt; also whether top-1 agreed at every position (1.0) or not (0.0)."""
    m = larql.load(REFS / arch)
    ref = np.load(REFS / f"{arch}.npz")
    n_prompts = len(json.loads((REFS / f"{arch}.json").read_text())["prompts"])
    worst = {"logits": 0.0, "resid": 0.0, "embed": 0.0, "top1": 1.0, "hook_q": 0.0}
    for p in range(n_prompts):
        ids = ref[f"p{p}.ids"]
        resid = [f"blocks.{i}.hook_resid_post" for i in range(m.config.n_layers)]
        names = ["hook_embed", "blocks.0.attn.hook_q", *resid]
        logits, cache = m.run_with_cache(ids, names)
        want = ref[f"p{p}.logits"]
        worst["logits"] = max(worst["logits"], rel_err(logits, want))
        if not np.array_equal(logits.argmax(-1), want.argmax(-1)):
            worst["top1"] = 0.0
        worst["embed"] = max(worst["embed"], rel_err(cache["hook_embed"], ref[f"p{p}.embed"]))
        for i in range(m.config.n_layers):
            err = rel_err(cache[f"blocks.{i}.hook_resid_post"], ref[f"p{p}.resid_post"][i])
            worst["resid"] = max(worst["resid"], err)
        q = cache["blocks.0.attn.hook_q"].reshape(len(ids), -1)  # (T, n_heads * head_dim)
        worst["hook_q"] = max(worst["hook_q"], rel_err(q, ref[f"p{p}.q0"]))
    return worst


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_architecture_matches_transformers(arch: str) -> None:
    w = measure(arch)
    assert w["top1"] == 1.0, f"{arch}: top-1 token differs from transformers at some position"
    assert w["logits"] <= TOL, f"{arch}: logits relative error {w['logits']:.2e}"
    assert w["embed"] <= TOL, f"{arch}: embedding relative error {w['embed']:.2e}"
    assert w["resid"] <= TOL, f"{arch}: per-layer residual relative error {w['resid']:.2e}"
    assert w["hook_q"] <= TOL, f"{arch}: attn.hook_q is not the q projection before RoPE ({w['hook_q']:.2e})"


def test_every_reference_architecture_is_covered() -> None:
    expected = {"llama3", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "phi3_longrope", "gpt2",
                "mixtral"}
    assert expected <= set(ARCHITECTURES), f"missing references: {sorted(expected - set(ARCHITECTURES))}"


def test_decode_through_the_kv_cache_matches_the_full_forward() -> None:
    """Sliding windows, soft-caps and learned positions hold one token at a time too."""
    for arch in ARCHITECTURES:
        m = larql.load(REFS / arch)
        ids = np.load(REFS / f"{arch}.npz")["p0.ids"][:12]
        full = m.forward(ids)
        cache = m.new_cache(len(ids))
        m.next_logits(ids[:1], cache)
        for t in range(1, len(ids)):
            step = m.next_logits(ids[t:t + 1], cache)
            assert rel_err(step, full[t]) <= TOL, f"{arch}: decode step {t}"


def test_longrope_generation_across_the_original_context_matches_transformers() -> None:
    """transformers' greedy generate from 28 tokens of prompt 0, 12 new ones, crossing the original
    context (32) at the 5th: larql's decode through its KV cache gives the same tokens and, at every
    step, transformers' logits."""
    m = larql.load(REFS / "phi3_longrope")
    ref = np.load(REFS / "phi3_longrope.npz")
    assert len(ref["gen.prompt"]) < 32 < len(ref["gen.prompt"]) + len(ref["gen.ids"])
    assert m.generate(ref["gen.prompt"].tolist(), max_new_tokens=len(ref["gen.ids"])).ids == ref["gen.ids"].tolist()
    cache = m.new_cache(64)
    logits = m.next_logits(ref["gen.prompt"], cache)
    for t, tok in enumerate(ref["gen.ids"]):
        assert rel_err(logits, ref["gen.scores"][t]) <= TOL, f"step {t}"
        logits = m.next_logits([int(tok)], cache)


def test_longrope_decode_across_the_original_context_reruns_with_the_long_factors() -> None:
    """Phi-3's longrope (original context 32): a pass ending at or before position 31 rotates with the
    short factors, one reaching past it with the long ones at every position. transformers' Phi-3
    generation drops its cache at the crossing and runs the whole sequence again; each decode step
    here equals the full forward of the sequence so far, before, at and after the crossing, one by
    one and in a packed batch beside a sequence that does not cross."""
    m = larql.load(REFS / "phi3_longrope")
    ref = np.load(REFS / "phi3_longrope.npz")
    ids = ref["p0.ids"][:40]
    assert rel_err(m.forward(ref["p0.ids"])[:32], m.forward(ids[:32])) > 1e-3  # the two regimes differ
    cache = m.new_cache(len(ids))
    m.next_logits(ids[:28], cache)
    for t in range(28, len(ids)):
        step = m.next_logits(ids[t:t + 1], cache)
        assert rel_err(step, m.forward(ids[:t + 1])[t]) <= TOL, f"decode step {t}"
    short = ref["p1.ids"]
    caches = [m.new_cache(40), m.new_cache(40)]
    m.next_logits_batch([ids[:32], short[:8]], caches)
    both = m.next_logits_batch([ids[32:34], short[8:10]], caches)
    assert rel_err(both[0], m.forward(ids[:34])[33]) <= TOL
    assert rel_err(both[1], m.forward(short[:10])[9]) <= TOL
    assert caches[0].length == 34 and np.array_equal(caches[0].ids, ids[:34])
    # a cache forked back to a short prefix (DESCRIBE's prefix reuse) holds long-rotated keys: a
    # short pass after it runs the prefix again with the short factors
    from larql.model.prefix import fork

    short_again = fork(caches[0], 20, 40)
    assert rel_err(m.next_logits(ids[20:25], short_again), m.forward(ids[:25])[24]) <= TOL


if __name__ == "__main__":  # each architecture's errors against transformers
    for name in ARCHITECTURES:
        w = measure(name)
        print(f"{name:8s} logits {w['logits']:.1e}  resid {w['resid']:.1e}  embed {w['embed']:.1e}  "
              f"hook_q {w['hook_q']:.1e}  top1 {'all' if w['top1'] else 'DIFFER'}")
