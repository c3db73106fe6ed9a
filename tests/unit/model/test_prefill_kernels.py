"""The prefill kernels against the numpy formulas they replace: gated activations and RMS norms bit
for bit, causal attention's softmax passes within float rounding (and, with hooks, bit for bit
the unhooked pass), the register-accumulator Q8_0 matvec within its rounding bound."""

from __future__ import annotations

import numpy as np
import pytest

from larql.model import attention as att
from larql.model import fused, prefill_ops
from larql.model.forward import add_normed, norm_rope, rms_norm
from larql.quant import dot_kernels, kernels, q8_0_rows

_C = np.float32(np.sqrt(2.0 / np.pi))


def _gelu(x: np.ndarray) -> np.ndarray:
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(_C * (x + np.float32(0.044715) * x * x * x)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def _wide(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Standard normals times scales from 1e-3 to 1e3 (large |x|: tanh saturates, exp overflows)."""
    return (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 10.0, 100.0, 1e3], size=shape)).astype(np.float32)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("shape", [(256, 2048), (1, 2048), (3, 7), (5, 33), (1, 1)])
def test_gated_mul_is_the_formula_bit_for_bit(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(shape[0] * 31 + shape[1])
    gate, up = _wide(rng, shape), _wide(rng, shape)
    kept_gate, kept_up = gate.copy(), up.copy()
    for name, formula in [("gelu_tanh", _gelu), ("silu", _silu)]:
        got = prefill_ops.gated_mul(name, gate, up)
        assert got.shape == shape and got.dtype == np.float32
        assert np.array_equal(got.view(np.uint32), (formula(gate) * up).view(np.uint32)), name
    assert np.array_equal(gate, kept_gate) and np.array_equal(up, kept_up)  # inputs not written


def _rms_norm_8_sums(x: np.ndarray, weight: np.ndarray, eps: np.float32) -> np.ndarray:
    """The norm's definition in numpy: per row 8 float64 running sums of squares (lane j: elements
    8i + j, in order of i), combined pairwise, plus the tail's; then the float32 scaling."""
    out = np.empty_like(x)
    n = x.shape[1]
    for r, row in enumerate(x):
        sq = row.astype(np.float64) ** 2
        lanes = np.zeros(8)
        for i in range(n // 8):
            lanes += sq[8 * i:8 * i + 8]
        tail = 0.0
        for v in sq[n // 8 * 8:]:
            tail += v
        total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])) + tail
        inv = np.float32(1.0) / np.sqrt(np.float32(total / n) + eps)
        out[r] = (row * inv) * weight
    return out


@pytest.mark.parametrize("shape", [(256, 640), (64, 256), (3, 7), (5, 13), (2, 8), (1, 1), (4, 1031)])
def test_rms_norm_rows_is_the_eight_sum_definition_bit_for_bit(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(shape[0] + 7 * shape[1])
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 1e3], size=(shape[0], 1))).astype(np.float32)
    w = rng.standard_normal(shape[1]).astype(np.float32)
    eps = np.float32(1e-6)
    got = np.empty_like(x)
    fused.rms_norm_rows(x, w, eps, got)
    assert np.array_equal(got.view(np.uint32), _rms_norm_8_sums(x, w, eps).view(np.uint32))
    # and the textbook formula within float32 rounding
    textbook = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(got, textbook, rtol=3e-6, atol=1e-30)
    a = _wide(rng, shape)
    summed = np.empty_like(x)
    fused.add_rms_norm_rows(x, a, w, eps, summed)  # the residual add fused: x + norm(a), the same bits
    assert np.array_equal(summed.view(np.uint32), (x + _rms_norm_8_sums(a, w, eps)).view(np.uint32))
    assert np.array_equal(add_normed(x, a, w, 1e-6), summed) and np.array_equal(add_normed(x, a, None, 1e-6), x + a)


def _attention_numpy(q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int, scale: float, window: int,
                     softcap: float) -> np.ndarray:
    """Masked causal attention over all keys in numpy (the definition the kernels replace)."""
    t, n_heads, d = q.shape
    n_kv, s, _ = keys.shape
    group = n_heads // n_kv
    qg = q.transpose(1, 0, 2).reshape(n_kv, group * t, d)
    scores = (np.matmul(qg, keys.transpose(0, 2, 1)) * np.float32(scale)).reshape(n_kv, group, t, s)
    if softcap:
        scores = np.tanh(scores / np.float32(softcap)) * np.float32(softcap)
    qpos, kpos = np.arange(start, start + t)[:, None], np.arange(s)[None, :]
    allowed = kpos <= qpos
    if window:
        allowed &= (qpos - kpos) < window
    scores = np.where(allowed, scores, np.float32(-np.inf))
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.matmul(probs.reshape(n_kv, group * t, s), values)
    return out.reshape(n_kv, group, t, d).transpose(2, 0, 1, 3).reshape(t, n_heads * d)


CASES = [(256, 0, 0, 0.0, (4, 1)), (200, 37, 0, 0.0, (8, 2)), (300, 0, 100, 0.0, (4, 4)), (150, 90, 64, 30.0, (6, 2)),
         (7, 0, 0, 0.0, (4, 1)), (1, 5, 3, 0.0, (2, 1)), (33, 500, 40, 50.0, (3, 3))]


@pytest.mark.parametrize(("t", "start", "window", "softcap", "heads"), CASES)
def test_attention_kernels_equal_the_numpy_definition(t: int, start: int, window: int, softcap: float,
                                                      heads: tuple[int, int]) -> None:
    n_heads, n_kv = heads
    rng = np.random.default_rng(t + start)
    q = (rng.standard_normal((t, n_heads, 32)) * 3).astype(np.float32)
    keys = (rng.standard_normal((n_kv, start + t, 32)) * 3).astype(np.float32)
    values = rng.standard_normal((n_kv, start + t, 32)).astype(np.float32)
    got = att.attention(q, keys, values, start, 0.2, window, softcap)
    expected = _attention_numpy(q, keys, values, start, 0.2, window, softcap)
    assert got.shape == expected.shape == (t, n_heads * 32) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-6)
    if t <= 2 * att.CAUSAL_CHUNK and not (window and start + t > window):  # one block over all keys: hooks add no change
        seen: dict[str, np.ndarray] = {}

        def keep(name: str):  # type: ignore[no-untyped-def]
            def hook(x: np.ndarray) -> np.ndarray:
                seen[name] = x.copy()
                return x
            return hook

        hooked = att.attention(q, keys, values, start, 0.2, window, softcap, keep("scores"), keep("pattern"))
        assert np.array_equal(hooked, got)
        assert seen["scores"].shape == seen["pattern"].shape == (t, n_heads, start + t)
        qpos, kpos = np.arange(start, start + t)[:, None, None], np.arange(start + t)[None, None, :]
        hidden = (kpos > qpos) | ((qpos - kpos >= window) if window else False)  # (T, 1, S) keys a query may not see
        assert np.all(np.isneginf(seen["scores"]) == np.broadcast_to(hidden, seen["scores"].shape))
        np.testing.assert_allclose(seen["pattern"].sum(-1), 1.0, rtol=0, atol=1e-5)


def test_a_scores_hook_unmasking_keys_is_obeyed() -> None:
    """The softmax after a scores hook does not mask again: what the hook returns is what counts."""
    rng = np.random.default_rng(3)
    q, keys, values = (rng.standard_normal(s).astype(np.float32) for s in ((5, 2, 16), (1, 5, 16), (1, 5, 16)))
    flat = att.attention(q, keys, values, 0, 0.25, 0, 0.0, lambda s: np.zeros_like(s))  # every key, equally
    np.testing.assert_allclose(flat.reshape(5, 2, 16), np.broadcast_to(values[0].mean(0), (5, 2, 16)), rtol=1e-5, atol=1e-6)


def _q8_0(rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Random Q8_0 rows (34-byte blocks: f16 d, then 32 int8) and their float64 weights."""
    blocks = rng.integers(0, 256, size=(rows, cols // 32, 34), dtype=np.uint8)
    d = (rng.standard_normal((rows, cols // 32)) * 0.02).astype(np.float16)
    blocks[:, :, :2] = d[..., None].view(np.uint8)
    q = blocks[:, :, 2:].view(np.int8).astype(np.float64)
    w = (d.astype(np.float64)[..., None] * q).reshape(rows, cols)
    return np.ascontiguousarray(blocks.reshape(rows, -1)), w


@pytest.mark.parametrize(("rows", "cols"), [(1, 32), (3, 64), (70, 96), (1001, 640), (5, 2048)])
def test_q8_0_matvec_is_the_product_within_its_rounding_bound(rows: int, cols: int) -> None:
    rng = np.random.default_rng(rows + cols)
    raw, w = _q8_0(rng, rows, cols)
    x = _wide(rng, (cols,))
    out = np.empty(rows, dtype=np.float32)
    q8_0_rows.matvec_q8_0(raw, x, out)
    exact = w @ x.astype(np.float64)
    # argmax.py's bound for any summation order: |F - w.x| <= 1.01 (n + 2) 2^-24 |w| |x|
    bound = 1.01 * (cols + 2) * 2.0 ** -24 * np.linalg.norm(w, axis=1) * np.linalg.norm(x.astype(np.float64))
    assert np.all(np.abs(out - exact) <= bound)
    via_table = np.empty(rows, dtype=np.float32)
    dot_kernels.matvec_q8_0(raw, raw.view(np.int8), kernels.F16_TO_F32, x, via_table)  # the MATVEC entry: this kernel
    assert np.array_equal(via_table, out)
    sub = np.ascontiguousarray(raw[rows // 2:])  # a row's value does not depend on the rows around it
    part = np.empty(len(sub), dtype=np.float32)
    q8_0_rows.matvec_q8_0(sub, x, part)
    assert np.array_equal(part, out[rows // 2:])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape", [(256, 4, 256), (7, 3, 16), (1, 1, 10)])
def test_norm_rope_is_the_norm_then_the_rotation_bit_for_bit(shape: tuple[int, int, int], interleaved: bool) -> None:
    rng = np.random.default_rng(sum(shape) + interleaved)
    x = _wide(rng, shape)
    w = rng.standard_normal(shape[2]).astype(np.float32)
    angles = (rng.standard_normal((shape[0], shape[2] // 2)) * 50).astype(np.float32)
    cos, sin = np.cos(angles), np.sin(angles)
    two_passes = att.apply_rope(rms_norm(x, w, 1e-6), cos, sin, interleaved)
    assert np.array_equal(norm_rope(x, w, 1e-6, cos, sin, interleaved).view(np.uint32), two_passes.view(np.uint32))
