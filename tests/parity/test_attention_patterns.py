"""`interp.attention_patterns`, every head's softmax, checked two ways.

- Against transformers: `output_attentions=True` of the tiny random-weight models of
  tests/golden/architectures (eager attention, float32; tools/make_attention_references.py), for
  every architecture larql runs: GQA, sliding windows, soft-caps, q/k norms, RoPE scalings, GPT-2's
  learned positions.
- Against a naive numpy recomputation on the real gemma3-270m: from the rotated q and k the hooks
  capture, scores = q . k * scale per head (a query head reads its key group's head), the causal and
  sliding-window masks, a float64 softmax.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import larql
from larql.model.interp import attention_patterns

REFS = Path(__file__).resolve().parents[1] / "golden" / "architectures"
ARCHITECTURES = sorted(p.name for p in REFS.iterdir() if p.is_dir())


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_patterns_match_transformers_output_attentions(arch: str) -> None:
    ref = np.load(REFS / f"{arch}.attn.npz")
    m = larql.load(REFS / arch)
    ids = [int(i) for i in ref["p1.ids"]]
    got = attention_patterns(m, ids)
    want = ref["p1.attentions"]  # (layers, heads, seq, seq)
    assert got.pattern.shape == want.shape and got.layers == list(range(m.config.n_layers))
    assert np.abs(got.pattern - want).max() <= 1e-6, f"{arch}: worst |difference| {np.abs(got.pattern - want).max():.2e}"
    assert np.array_equal(got.pattern == 0, want == 0)  # the same masked (causal, windowed) cells


def naive_pattern(q: np.ndarray, k: np.ndarray, scale: float, window: int, softcap: float) -> np.ndarray:
    """(heads, T, T) from rotated q (T, heads, d) and k (T, kv_heads, d), in float64."""
    t, heads, _ = q.shape
    group = heads // k.shape[1]
    out = np.zeros((heads, t, t))
    for h in range(heads):
        s = q[:, h].astype(np.float64) @ k[:, h // group].astype(np.float64).T * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        qi, kj = np.indices((t, t))
        s[(kj > qi) | ((qi - kj >= window) if window else False)] = -np.inf
        e = np.exp(s - s.max(axis=1, keepdims=True))
        out[h] = e / e.sum(axis=1, keepdims=True)
    return out


def test_patterns_match_a_numpy_recomputation_on_gemma(gemma: larql.Model) -> None:
    ids = gemma.tokenize("The capital of France is Paris, and the capital of Japan is")
    c = gemma.config
    got = attention_patterns(gemma, ids, layers=[0, 5, c.n_layers - 1])
    names = [f"blocks.{i}.attn.hook_rot_{x}" for i in got.layers for x in "qk"]
    _, cache = gemma.run_with_cache(ids, names)
    for n, layer in enumerate(got.layers):
        want = naive_pattern(cache[f"blocks.{layer}.attn.hook_rot_q"], cache[f"blocks.{layer}.attn.hook_rot_k"],
                             c.attn_scale, c.layer_window(layer), c.attn_softcap)
        assert np.abs(got.pattern[n] - want).max() <= 1e-5, layer
        assert np.allclose(got.pattern[n].sum(axis=-1), 1.0, atol=1e-5)
    assert got.tokens[1] == "The" and len(got.tokens) == len(ids) and got.layer(5).shape == (c.n_heads, len(ids), len(ids))


def test_bad_layers_are_refused(gemma: larql.Model) -> None:
    with pytest.raises(larql.errors.ModelError, match="no layer 99"):
        attention_patterns(gemma, gemma.tokenize("Hi"), layers=[99])
    with pytest.raises(larql.errors.ModelError, match="not among the layers captured"):
        attention_patterns(gemma, gemma.tokenize("Hi"), layers=[1]).layer(2)
