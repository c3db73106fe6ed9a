"""RMS norm (numba) against float64, and the gated activations against their definitions."""

from __future__ import annotations

import numpy as np
import pytest

from larql.model.ffn import gated, gelu_tanh, silu
from larql.model.forward import rms_norm


def test_rms_norm_matches_float64() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 4, 640)) * 30).astype(np.float32)  # (T, heads, d): normalised over d
    w = rng.standard_normal(640).astype(np.float32)
    x64 = x.astype(np.float64)
    expected = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + 1e-6) * w
    got = rms_norm(x, w, 1e-6)
    assert got.shape == x.shape and got.dtype == np.float32
    assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) < 1e-6
    strided = rms_norm(x[:, :, ::2], w[::2], 1e-6)  # non-contiguous input is accepted
    assert np.allclose(strided, rms_norm(np.ascontiguousarray(x[:, :, ::2]), np.ascontiguousarray(w[::2]), 1e-6))


@pytest.mark.parametrize("activation, numpy_act", [("gelu_tanh", gelu_tanh), ("silu", silu)])
def test_gated_activation_matches_numpy(activation: str, numpy_act) -> None:
    rng = np.random.default_rng(1)
    gate = (rng.standard_normal((5, 2048)) * 4).astype(np.float32)
    up = rng.standard_normal((5, 2048)).astype(np.float32)
    expected = numpy_act(gate) * up
    got = gated(activation, gate, up)
    assert np.max(np.abs(got - expected)) <= 1e-6 * np.max(np.abs(expected))


@pytest.mark.parametrize("n_heads, n_kv, window, softcap", [(4, 1, 0, 0.0), (9, 3, 0, 0.0), (4, 2, 7, 0.0),
                                                            (4, 2, 0, 50.0), (4, 2, 64, 0.0)])
def test_decode_attention_matches_the_masked_numpy_path(n_heads: int, n_kv: int, window: int, softcap: float) -> None:
    from larql.model.attention import attention

    rng = np.random.default_rng(n_heads + window)
    s, d = 40, 32
    cache_k = rng.standard_normal((n_kv, 64, d)).astype(np.float32)  # capacity 64, 40 filled
    cache_v = rng.standard_normal((n_kv, 64, d)).astype(np.float32)
    keys, values = cache_k[:, :s], cache_v[:, :s]
    q = rng.standard_normal((1, n_heads, d)).astype(np.float32)
    fast = attention(q, keys, values, s - 1, 0.2, window, softcap)
    # an identity scores hook forces the general path: full scores, explicit causal/window mask
    masked = attention(q, keys, values, s - 1, 0.2, window, softcap, scores_hook=lambda x: x)
    assert fast.shape == (1, n_heads * d)
    assert np.max(np.abs(fast - masked)) < 1e-5 * np.max(np.abs(masked))
    copied = attention(q, keys.copy(), values.copy(), s - 1, 0.2, window, softcap)  # not a view of a cache
    assert np.array_equal(copied, fast)


@pytest.mark.parametrize("s", [200, 256, 300], ids=lambda s: f"{s}pos")
def test_decode_attention_on_one_thread_or_two_below_and_above_the_serial_size(s: int) -> None:
    """attend_one runs its ranges on this thread below fused.SERIAL_BELOW (position, key/value head)
    pairs and on numba's threads above it (4 key/value heads: 200 and 256 positions below, 300 above):
    the masked numpy path's values either way, and the same bits on one thread as on two."""
    import numba

    from larql.model import fused
    from larql.model.attention import attention

    n_heads, n_kv, d = 8, 4, 32
    assert 200 * n_kv < fused.SERIAL_BELOW <= 300 * n_kv
    rng = np.random.default_rng(s)
    keys = rng.standard_normal((n_kv, s, d)).astype(np.float32)
    values = rng.standard_normal((n_kv, s, d)).astype(np.float32)
    q = rng.standard_normal((1, n_heads, d)).astype(np.float32)
    fast = attention(q, keys, values, s - 1, 0.2, 0, 0.0)
    masked = attention(q, keys, values, s - 1, 0.2, 0, 0.0, scores_hook=lambda x: x)
    assert np.max(np.abs(fast - masked)) < 1e-5 * np.max(np.abs(masked))
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        assert np.array_equal(attention(q, keys, values, s - 1, 0.2, 0, 0.0), fast)
    finally:
        numba.set_num_threads(threads)
