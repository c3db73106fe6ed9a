"""Transcoders in SAELens' format: loading and refusals, encode and output against a float64 reference
of SAELens' equations, and a transcoder in place of a layer's MLP in the forward pass (the cache, the
replacement, the error term, feature edits, generation, steering) on the tiny models (with and
without Gemma's post-FFN norm) and on gemma3-270m. Every transcoder is written by the test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import larql
from larql.errors import ModelError, ModelFormatError, UnsupportedError
from larql.model.hooks import Add, Replace
from tests.sae_files import transcoder_cfg, transcoder_tensors, write_sae

IDS = [5, 71, 72, 3, 200, 9, 9, 44]
LAYER = 1
IN = f"blocks.{LAYER}.ln2.hook_normalized"
MID, POST = f"blocks.{LAYER}.hook_resid_mid", f"blocks.{LAYER}.hook_resid_post"
F32 = np.float32
VARIANTS = [(False, False), (True, False), (False, True), (True, True)]  # (jumprelu, skip)


def reference(t: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(acts, out) in float64, written from SAELens' Transcoder / JumpReLUTranscoder / SkipTranscoder."""
    w = {n: v.astype(np.float64) for n, v in t.items()}
    x = np.asarray(x, np.float64)
    pre = x @ w["W_enc"] + w["b_enc"]
    acts = np.maximum(pre, 0.0)
    if "threshold" in w:
        acts = acts * (pre > w["threshold"])
    out = acts @ w["W_dec"] + w["b_dec"]
    return acts, out + x @ w["W_skip"].T if "W_skip" in w else out


def mlp_input64(m: larql.Model, layer: int, resid_mid: np.ndarray) -> np.ndarray:
    """The MLP's normed input in float64: RMS norm with the pre-FFN norm's weight."""
    assert m.config.norm == "rms"
    x = np.asarray(resid_mid, np.float64)
    w = np.asarray(m.weights.layers[layer].ffn_norm, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + m.config.norm_eps) * w


@pytest.fixture(scope="module")
def m(tiny: dict) -> larql.Model:
    return larql.load(tiny["root"] / "f32.gguf")


def write(path: Path, h: int, jumprelu: bool = False, skip: bool = False, layer: int = LAYER, d_sae: int = 80,
          seed: int = 1, scale: float = 8.0, **cfg: Any) -> tuple[Path, dict[str, np.ndarray]]:
    t = transcoder_tensors(h, d_sae, seed, jumprelu, skip, scale)
    return write_sae(path, t, transcoder_cfg(h, d_sae, layer, jumprelu, skip) | cfg), t


@pytest.mark.parametrize(("jumprelu", "skip"), VARIANTS)
def test_encode_and_output_match_a_float64_reference(tmp_path: Path, jumprelu: bool, skip: bool) -> None:
    path, t = write(tmp_path / "tc", 16, jumprelu, skip, d_sae=40, scale=4.0)
    tc = larql.load_sae(path)
    assert isinstance(tc, larql.Transcoder) and (tc.hook_name, tc.hook_name_out) == (IN, f"blocks.{LAYER}.hook_mlp_out")
    assert (tc.d_in, tc.d_sae, tc.d_out, tc.architecture) == (16, 40, 16, "jumprelu" if jumprelu else "standard")
    assert tc.kind == ("skip transcoder" if skip else "transcoder")
    x = (4.0 * np.random.default_rng(4).standard_normal((12, 16))).astype(F32)
    acts, out = reference(t, x)
    got = tc.encode(x)
    assert np.array_equal(got > 0, acts > 0) and 0 < (acts > 0).mean() < 1
    assert np.allclose(got, acts, atol=1e-5) and np.allclose(tc(x), out, atol=1e-5)
    if jumprelu:  # some features gated off by a threshold above 0
        assert np.any((x @ t["W_enc"] + t["b_enc"] > 0) & (acts == 0))


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"metadata": {"hook_name": IN}}, ModelFormatError, "a transcoder needs hook_name_out"),
    ({"apply_b_dec_to_input": True}, UnsupportedError, "apply_b_dec_to_input"),
    ({"architecture": "transcoder"}, ModelFormatError, "a W_skip tensor (a skip transcoder's), but cfg.json's "
                                                       "architecture is 'transcoder'"),
    ({"d_out": 8}, ModelFormatError, "W_dec has shape [40, 16], but cfg.json's d_in = 16, d_sae = 40 and d_out = 8"),
    ({"architecture": "topk_transcoder"}, UnsupportedError, "architecture 'topk_transcoder' is not supported"),
])
def test_files_that_do_not_fit_are_refused_in_one_line(tmp_path: Path, change: dict, error: type,
                                                       message: str) -> None:
    path, _ = write(tmp_path / "bad", 16, skip=True, d_sae=40, **change)
    with pytest.raises(error) as e:
        larql.load_sae(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_what_does_not_match_the_model_is_refused(m: larql.Model, tmp_path: Path) -> None:
    h = m.config.hidden
    cases = [(write(tmp_path / "w", h // 2)[0], "d_in = 32, but the MLP of this model reads and writes width 64"),
             (write(tmp_path / "l", h, layer=9)[0], "layer 9 is out of range"),
             (write(tmp_path / "x", h, metadata={"hook_name": "blocks.1.ln2.hook_normalized",
                                                 "hook_name_out": "blocks.2.hook_mlp_out"})[0],
              "reads layer 1 and writes layer 2 (a cross-layer transcoder)"),
             (write(tmp_path / "r", h, metadata={"hook_name": "blocks.1.hook_resid_mid",
                                                 "hook_name_out": "blocks.1.hook_mlp_out"})[0],
              "input hook blocks.1.hook_resid_mid is not an MLP's input")]
    for path, message in cases:
        with pytest.raises((ModelError, UnsupportedError)) as e:
            m.forward(IDS, saes=[larql.load_sae(path)])
        assert message in str(e.value) and "\n" not in str(e.value), message
    one = larql.load_sae(write(tmp_path / "a", h)[0])
    other = larql.load_sae(write(tmp_path / "b", h, metadata={"hook_name": "blocks.1.hook_mlp_in",
                                                              "hook_name_out": "blocks.1.hook_mlp_out"})[0])
    with pytest.raises(ModelError, match="both replace layer 1's MLP"):
        m.forward(IDS, saes=[one, other])


@pytest.fixture(scope="module")
def skip_tc(m: larql.Model, tmp_path_factory: pytest.TempPathFactory) -> tuple[larql.Transcoder, dict]:
    path, t = write(tmp_path_factory.mktemp("tc") / "skip", m.config.hidden, jumprelu=True, skip=True)
    tc = larql.load_sae(path)
    assert isinstance(tc, larql.Transcoder)
    return tc, t


def test_the_transcoder_replaces_the_mlp(m: larql.Model, skip_tc: tuple) -> None:
    tc, t = skip_tc
    base, plain = m.run_with_cache(IDS, names=[MID, POST])
    acts, out = reference(t, mlp_input64(m, LAYER, plain[MID]))
    logits, cache = m.run_with_cache(IDS, saes=[tc])
    got = cache[f"{IN}.hook_sae_acts_post"]
    assert got.shape == (len(IDS), 80) and 0 < (got > 0).mean() < 1
    assert np.array_equal(got > 0, acts > 0) and np.allclose(got, acts, atol=1e-4)
    assert np.allclose(cache[f"{IN}.hook_sae_input"], mlp_input64(m, LAYER, plain[MID]), atol=1e-5)
    assert np.allclose(cache[f"{IN}.hook_sae_recons"], out, atol=1e-4)
    assert np.array_equal(cache[f"{IN}.hook_sae_output"], cache[f"{IN}.hook_sae_recons"])
    # the layer's residual: resid_mid + the transcoder's output in place of the MLP's
    assert np.allclose(cache[POST], plain[MID] + out, atol=1e-4)
    assert np.allclose(cache[f"{IN}.hook_sae_error"], (plain[POST] - plain[MID]) - out, atol=1e-4)
    assert np.array_equal(m.forward(IDS, hooks={POST: Replace(cache[POST])}), logits)
    assert not np.allclose(logits, base, atol=1e-2) and np.array_equal(m.forward(IDS, saes=[tc]), logits)


def test_the_error_term_gives_the_models_logits_exactly(m: larql.Model, skip_tc: tuple) -> None:
    tc, _ = skip_tc
    base = m.forward(IDS)
    logits, cache = m.run_with_cache(IDS, saes=[tc], use_error_term=True)
    assert np.array_equal(logits, base) and np.any(cache[f"{IN}.hook_sae_acts_post"] > 0)
    assert m.generate(IDS, 5, stop_at_eos=False, saes=[tc], use_error_term=True).ids == \
        m.generate(IDS, 5, stop_at_eos=False).ids


def test_an_edited_feature_changes_the_mlps_output_by_its_decoder_row(m: larql.Model, skip_tc: tuple) -> None:
    tc, t = skip_tc
    _, plain = m.run_with_cache(IDS, names=[MID, POST])
    acts, _ = reference(t, mlp_input64(m, LAYER, plain[MID]))
    f = int(np.argmax(acts[-1]))

    def ablate(a: np.ndarray, name: str) -> np.ndarray:
        out = a.copy()
        out[:, f] = 0.0
        return out

    hooks = {f"{IN}.hook_sae_acts_post": ablate}
    want = plain[POST] - acts[:, f:f + 1] * t["W_dec"][f].astype(np.float64)
    logits, cache = m.run_with_cache(IDS, hooks=hooks, saes=[tc], use_error_term=True)
    assert np.allclose(cache[POST], want, atol=1e-4) and np.all(cache[f"{IN}.hook_sae_acts_post"][:, f] == 0)
    assert np.allclose(logits, m.forward(IDS, hooks={POST: Replace(want.astype(F32))}), atol=1e-4)


def test_generation_and_steering(m: larql.Model, skip_tc: tuple) -> None:
    tc, t = skip_tc
    gen = m.generate(IDS[:4], 5, stop_at_eos=False, saes=[tc]).ids
    ids = list(IDS[:4])
    for _ in range(5):  # recomputed from scratch each step, no KV cache
        ids.append(int(np.argmax(m.forward(ids, saes=[tc])[-1])))
    assert gen == ids[4:]
    spec = tc.steer(3, 50.0, positions=[6, 7])
    manual = {POST: Add((50.0 * t["W_dec"][3].astype(np.float64)).astype(F32), positions=[6, 7])}
    assert list(spec) == [POST] and np.array_equal(m.forward(IDS, hooks=spec), m.forward(IDS, hooks=manual))


def test_on_gemma3_270m(tmp_path: Path) -> None:
    """Gemma Scope 2's names (hook_mlp_in in, hook_mlp_out after the post-FFN norm) at layer 6."""
    m = larql.load("gemma3-270m")
    layer, h = 6, m.config.hidden
    name = f"blocks.{layer}.hook_mlp_in"
    t = transcoder_tensors(h, 256, seed=2, jumprelu=True, skip=True, scale=16.0)
    tc = larql.load_sae(write_sae(tmp_path / "g", t, transcoder_cfg(h, 256, layer, True, True, "hook_mlp_in")))
    ids = m.tokenize("The Eiffel Tower stands in the middle of Paris")
    mid, post = f"blocks.{layer}.hook_resid_mid", f"blocks.{layer}.hook_resid_post"
    base, plain = m.run_with_cache(ids, names=[mid, post])
    x = mlp_input64(m, layer, plain[mid])
    acts, out = reference(t, x)
    logits, cache = m.run_with_cache(ids, saes=[tc])
    got = cache[f"{name}.hook_sae_acts_post"]
    assert 0 < (acts > 0).mean() < 1 and np.array_equal(got > 0, acts > 0)
    assert np.max(np.abs(got - acts)) < 1e-4 * max(1.0, np.abs(acts).max())
    assert np.allclose(cache[post], plain[mid] + out, rtol=1e-4, atol=1e-3)
    assert not np.allclose(logits, base, atol=1e-1)
    assert np.array_equal(m.forward(ids, saes=[tc], use_error_term=True), base)
