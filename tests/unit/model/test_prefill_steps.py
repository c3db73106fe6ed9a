"""Prefill's row-wise steps: the in-place activations give the textbook formulas' bits, and causal
attention by query blocks equals the masked whole within float rounding."""

from __future__ import annotations

import numpy as np
import pytest

from larql.model import attention as att
from larql.model import ffn

_C = np.float32(np.sqrt(2.0 / np.pi))


def _gelu(x: np.ndarray) -> np.ndarray:
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(_C * (x + np.float32(0.044715) * x * x * x)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("shape", [(1, 2048), (256, 2048), (3, 7)])
def test_activations_are_the_formulas_bit_for_bit(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * rng.choice([0.01, 1.0, 10.0, 100.0], size=shape)).astype(np.float32)
    up = rng.standard_normal(shape).astype(np.float32)
    for name, formula, fn in [("gelu_tanh", _gelu, ffn.gelu_tanh), ("silu", _silu, ffn.silu)]:
        assert np.array_equal(fn(x).view(np.uint32), formula(x).view(np.uint32))
        assert np.array_equal(ffn.gated(name, x, up).view(np.uint32), (formula(x) * up).view(np.uint32))
        assert np.array_equal(fn(x[:, ::2]).view(np.uint32), formula(x[:, ::2]).view(np.uint32))
    kept = x.copy()
    ffn.gated("gelu_tanh", x, up)
    assert np.array_equal(x, kept)  # the gate scores are not overwritten (edits' top-k reads them)


@pytest.mark.parametrize(("t", "start", "window", "softcap", "heads"),
                         [(256, 0, 0, 0.0, (4, 1)), (200, 37, 0, 0.0, (8, 2)), (300, 0, 100, 0.0, (4, 4)),
                          (150, 90, 64, 30.0, (6, 2))])
def test_causal_blocks_equal_the_masked_whole(monkeypatch: pytest.MonkeyPatch, t: int, start: int, window: int,
                                              softcap: float, heads: tuple[int, int]) -> None:
    n_heads, n_kv = heads
    rng = np.random.default_rng(t)
    q = rng.standard_normal((t, n_heads, 32)).astype(np.float32)
    keys = rng.standard_normal((n_kv, start + t, 32)).astype(np.float32)
    values = rng.standard_normal((n_kv, start + t, 32)).astype(np.float32)
    blocks = att.attention(q, keys, values, start, 0.2, window, softcap)
    monkeypatch.setattr(att, "CAUSAL_CHUNK", 10**6)
    whole = att.attention(q, keys, values, start, 0.2, window, softcap)
    assert blocks.shape == whole.shape == (t, n_heads * 32)
    assert np.allclose(blocks, whole, rtol=1e-5, atol=1e-6)


def _rope_numpy(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    c, s = cos[:, None, :], sin[:, None, :]
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x1 * c - x2 * s
        out[..., 1::2] = x2 * c + x1 * s
        return out
    half = x.shape[-1] // 2
    return np.concatenate([x[..., :half] * c - x[..., half:] * s, x[..., half:] * c + x[..., :half] * s], axis=-1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape", [(256, 4, 256), (1, 9, 64), (7, 2, 16)])
def test_rope_kernel_is_the_numpy_definition_bit_for_bit(shape: tuple[int, int, int], interleaved: bool) -> None:
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 20).astype(np.float32)
    angles = rng.standard_normal((shape[0], shape[2] // 2)).astype(np.float32) * 50
    cos, sin = np.cos(angles), np.sin(angles)
    got = att.apply_rope(x, cos, sin, interleaved)
    assert np.array_equal(got.view(np.uint32), _rope_numpy(x, cos, sin, interleaved).view(np.uint32))
    strided = x[:, :, :]  # a view of q's projection in the forward pass is not contiguous
    assert np.array_equal(att.apply_rope(strided.transpose(1, 0, 2).transpose(1, 0, 2), cos, sin, interleaved), got)
