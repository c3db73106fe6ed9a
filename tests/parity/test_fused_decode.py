"""A decode step's attention in two numba calls (Forward.decode_attention) against the general path
(q/k norms, RoPE, the cache write and attention as separate steps): the same logits bit for bit and
the same KV cache, on every tiny architecture and both bundled models."""

from __future__ import annotations

import numpy as np
import pytest

import larql
from larql.model.forward import Forward
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
