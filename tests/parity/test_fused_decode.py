"""A decode step's attention in two numba calls (Forward.decode_attention) against the general path
(q/k norms, RoPE, the cache write and attention as separate steps): the same logits bit for bit and
the same KV cache, on every tiny architecture and both bundled models."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import larql
from larql.model.ffn import FFN
from larql.model.forward import Forward
from larql.model.hooks import HookFns
from tests.parity.test_architectures import ARCHITECTURES, REFS


def _decode(m: larql.Model, fused: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[np.ndarray], larql.model.attention.KVCache]:
    monkeypatch.setattr(Forward, "fused_decode", fused)
    ids = m.tokenize("The history of the city begins with a small settlement")[:12]
    cache = m.new_cache(4)  # grows while decoding: the fused path writes into the grown arrays
    logits = [m.next_logits(ids, cache)]
    for _ in range(6):
        logits.append(m.next_logits([int(np.argmax(logits[-1]))], cache))
    return logits, cache


def _same(m: larql.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    fused, fc = _decode(m, True, monkeypatch)
    plain, pc = _decode(m, False, monkeypatch)
    for a, b in zip(fused, plain):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert fc.length == pc.length
    for a, b in zip(fc.k + fc.v, pc.k + pc.v):
        assert np.array_equal(a[:, :fc.length], b[:, :pc.length])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fused_decode_is_the_general_path_on_every_architecture(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _same(larql.load(REFS / arch), monkeypatch)


def test_fused_decode_is_the_general_path_on_the_bundled_models(real_model: larql.Model,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _same(real_model, monkeypatch)


def test_fused_decode_with_interleaved_rope(tiny: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny GGUF llama: q/k rows permuted by llama.cpp's converter, RoPE on (x[2i], x[2i+1]) pairs."""
    m = larql.load(tiny["root"] / "q8.gguf")
    _same(m, monkeypatch)


def _quantized(m: larql.Model) -> larql.Model:
    """m with every layer matrix re-quantized by gguf-py, cycling through Q8_0, Q4_1 and Q5_0 (so each
    of decode_layer's kernels, Q8_0's rows and the repacked layouts with and without offsets, meets
    every kind of matrix somewhere)."""
    import gguf

    from larql.quant.tensor import QuantMatrix
    from larql.quant.types import GGMLType

    kinds = (GGMLType.Q8_0, GGMLType.Q4_1, GGMLType.Q5_0)
    layers = []
    for i, lw in enumerate(m.weights.layers):
        parts = {}
        for j, name in enumerate(("q", "k", "v", "o", "gate", "up", "down")):
            mat = getattr(lw, name)
            if mat is None:
                continue
            kind = kinds[(i + j) % len(kinds)]
            raw = gguf.quants.quantize(mat.dequantize(), gguf.GGMLQuantizationType(int(kind)))
            parts[name] = QuantMatrix(mat.name, kind, mat.n_rows, mat.n_cols, np.ascontiguousarray(raw))
        layers.append(replace(lw, **parts))
    weights = replace(m.weights, layers=tuple(layers))
    return larql.Model(m.name, m.source, m.config, weights, m.tokenizer)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_decode_layers_are_the_general_path_on_quantized_architectures(arch: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """decode_layer.py's direct kernel calls, where the block is the plain one (RMS norms, a gated
    MLP: every architecture here but GPT-2's LayerNorm and Mixtral's experts), give the general
    path's logits and cache bit for bit: Qwen2's q/k/v biases, Gemma 2's soft-cap, Gemma 3's q/k norms,
    sandwich norms and sliding window, Llama 3's and longrope's RoPE tables included."""
    m = _quantized(larql.load(REFS / arch))
    m.next_logits(m.tokenize("The history")[:3])
    plan = m._forward.decode_layers()
    assert plan is not None
    covered = sum(plan.covers(i) for i in range(m.config.n_layers))
    assert covered == (0 if arch in ("gpt2", "mixtral") else m.config.n_layers)
    _same(m, monkeypatch)


def test_decode_layers_cover_the_bundled_models(real_model: larql.Model) -> None:
    """Every layer of both bundled models takes decode_layer's path (the parity test above compares
    it with the general path; here: that it is the path taken)."""
    real_model.next_logits(real_model.tokenize("The capital of France is")[:4])
    plan = real_model._forward.decode_layers()
    assert plan is not None and all(plan.covers(i) for i in range(real_model.config.n_layers))


def test_decode_layers_across_longrope_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Phi-3's longrope switches to its long factors past the original context (32 here): a decode
    step that crosses it reruns the sequence (Forward.rewind_longrope) and the steps after it use
    the long tables — with decode_layer's path as without."""
    m = _quantized(larql.load(REFS / "phi3_longrope"))
    ids = m.tokenize("The history of the city begins with a small settlement on the river " * 4)[:28]
    assert len(ids) == 28

    def run(fused: bool) -> list[np.ndarray]:
        monkeypatch.setattr(Forward, "fused_decode", fused)
        cache = m.new_cache(8)
        logits = [m.next_logits(ids, cache)]
        for _ in range(10):  # positions 28 .. 37: across 32
            logits.append(m.next_logits([int(np.argmax(logits[-1]))], cache))
        return logits

    for a, b in zip(run(True), run(False)):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


class _Doubled(FFN):
    """An FFN block computed elsewhere (as model/remote_ffn.py's RemoteFFN): here twice the local one."""

    def __init__(self, local: FFN) -> None:
        self.local, self.calls = local, 0

    def __call__(self, i: int, h: np.ndarray, hooks: HookFns | None, start: int) -> np.ndarray:
        self.calls += 1
        return 2 * self.local(i, h, hooks, start)


def test_a_replaced_ffn_block_runs_at_every_decode_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Model.with_ffn` (a remote FFN): decode steps call the replacement, not the local weights."""
    m = _quantized(larql.load(REFS / "llama3"))
    wrapped = m.with_ffn(_Doubled)
    ffn = wrapped._forward.ffn
    assert isinstance(ffn, _Doubled) and wrapped._forward.decode_layers() is None
    cache = wrapped.new_cache(16)
    wrapped.next_logits(m.tokenize("The history")[:3], cache)
    ffn.calls = 0
    got = wrapped.next_logits([5], cache)
    assert ffn.calls == m.config.n_layers
    _same(wrapped, monkeypatch)
    assert not np.allclose(got, m.next_logits(m.tokenize("The history")[:3] + [5]), atol=1e-3)
