"""The batched top-k on the tiled int8 copy (topk_tiles.py): its scores are argmax_tiles' for each
activation, and QuantMatrix.top_k through it is the top k of the exact product, ties to the lower id."""

from __future__ import annotations

import numpy as np
import pytest

from larql.quant import GGMLType, QuantMatrix, argmax, argmax_tiles, isa, tensor, topk_tiles
from tests.unit.quant.test_kernels import random_matrix

needs_vnni = pytest.mark.skipif(not argmax.HAVE_VNNI, reason="no AVX-512 VNNI: the VNNI kernel cannot run")
needs_tiled = pytest.mark.skipif(not argmax.HAVE_TILED, reason="the float32 tier: top_k runs the float32 chunks")
needs_avx2 = pytest.mark.skipif(not isa.runs("avx2"), reason="no AVX2: the AVX2 kernel cannot run")


def _batch_case(n_act: int) -> tuple[argmax_tiles.Tiled, np.ndarray, np.ndarray]:
    """A tiled 1,029-row Q8_0 matrix (a partial last tile), n_act activations (one of them zero) and
    the approximate scores' buffer."""
    m = random_matrix(GGMLType.Q8_0, 1029, 640, seed=3)
    tiled = argmax_tiles.Tiled(m.raw, argmax.row_norms(m.raw))
    x = (np.random.default_rng(4).standard_normal((n_act, 640)) * 2).astype(np.float32)
    x[5] = 0.0
    return tiled, x, np.empty((n_act, tiled.packed.shape[0] * argmax_tiles.ROWS), np.float32)


def _exact_top_k(m: QuantMatrix, x: np.ndarray, k: int) -> np.ndarray:
    full = x.astype(np.float64) @ m.dequantize().astype(np.float64).T  # (t, rows)
    ids = np.arange(full.shape[1])
    return np.stack([np.lexsort((ids, -row))[:k] for row in full])


@needs_vnni
def test_batch_scores_are_the_one_activation_kernels_bit_for_bit() -> None:
    """TB activations per tile visit give each activation the same A as argmax_tiles.scores (the same
    codes, block dots and fma order), partial last tile included."""
    tiled, x, got = _batch_case(3 * topk_tiles.TB)
    slack = topk_tiles.batch_scores(tiled.packed, tiled.scales, x, got, argmax.rounding(640))
    for b in range(len(x)):
        one = np.empty(got.shape[1], np.float32)
        argmax_tiles.scores(tiled.packed, tiled.scales, 1029, x[b], one)
        assert np.array_equal(got[b, :1029].view(np.uint32), one[:1029].view(np.uint32)), b
    assert np.all(slack > 0) and np.all(np.isfinite(slack))


@needs_avx2
def test_the_avx2_batch_gives_each_activation_the_one_activation_scores_bit_for_bit() -> None:
    """The AVX2 tier's batch (argmax_tiles' AVX2 kernel an activation at a time) gives argmax_tiles'
    AVX2 scores, and so the VNNI batch's where that runs, and the same slack."""
    tiled, x, got = _batch_case(2 * topk_tiles.TB + 3)
    slack = topk_tiles.batch_scores_avx2(tiled.packed, tiled.scales, x, got, argmax.rounding(640))
    for b in range(len(x)):
        one = np.empty(got.shape[1], np.float32)
        argmax_tiles.scores_avx2(tiled.packed, tiled.scales, 1029, x[b], one)
        assert np.array_equal(got[b, :1029].view(np.uint32), one[:1029].view(np.uint32)), b
    if argmax.HAVE_VNNI:
        n = 2 * topk_tiles.TB
        vnni = np.empty((n, got.shape[1]), np.float32)
        vnni_slack = topk_tiles.batch_scores(tiled.packed, tiled.scales, x[:n], vnni, argmax.rounding(640))
        assert np.array_equal(got[:n, :1029].view(np.uint32), vnni[:, :1029].view(np.uint32))
        assert np.array_equal(slack[:n], vnni_slack)


@needs_tiled
@pytest.mark.parametrize("k", [1, 9, 300])
def test_top_k_is_the_exact_top_k_with_ties_to_the_lower_id(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the tiled copy (the float32 chunks made to fail), top_k of 70 activations (a full
    batch and a partial one) over 1,029 rows equals ranking the float64 product: repeated rows tie
    and keep their order, a zero activation ties every row (ids 0..k-1), large and small scales."""
    m = random_matrix(GGMLType.Q8_0, 1029, 640, seed=8)
    m.raw[[700, 900]] = m.raw[17]  # three equal rows: equal scores
    rng = np.random.default_rng(5)
    x = rng.standard_normal((70, 640)).astype(np.float32)
    x[3] = 0.0
    x[4] *= 1e4
    x[5] *= 1e-4
    x[6] = m.dequantize(slice(17, 18))[0]  # row 17 (and its copies) on top
    want = _exact_top_k(m, x, k)

    def no_float_path(*args: object) -> None:
        raise AssertionError("top_k took the float32 chunks")

    monkeypatch.setattr(QuantMatrix, "_float_chunks", no_float_path)
    monkeypatch.setattr(tensor, "TILED_TOP_K_ROWS", 64)
    got = m.top_k(x, k)
    assert got.shape == (70, k) and got.dtype == np.int64
    assert np.array_equal(got, want)
    assert np.array_equal(got[3], np.arange(k))
    if k >= 3:
        assert list(got[6, :3]) == [17, 700, 900]


@needs_tiled
def test_a_few_rows_stay_on_the_float_path_until_the_copy_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below TILED_TOP_K_ROWS no tiled copy is made for top_k (its making would cost more than it saves);
    once it exists, any batch uses it; a non-finite activation takes the float32 path."""
    m = random_matrix(GGMLType.Q8_0, 300, 640, seed=9)
    x = np.random.default_rng(6).standard_normal((5, 640)).astype(np.float32)
    want = _exact_top_k(m, x, 7)
    assert np.array_equal(m.top_k(x, 7), want) and not m._tiled
    monkeypatch.setattr(tensor, "TILED_TOP_K_ROWS", 5)
    assert np.array_equal(m.top_k(x, 7), want) and m._tiled and m._tiled[0] is not None
    monkeypatch.setattr(tensor, "TILED_TOP_K_ROWS", 10 ** 9)
    seen = []
    monkeypatch.setattr(topk_tiles, "top_k", lambda *a: seen.append(1) or want)
    assert np.array_equal(m.top_k(x, 7), want) and seen == [1]  # the copy exists: used for a few rows too
    x[2, 0] = np.nan
    got = m.top_k(x, 7)
    assert seen == [1] and np.array_equal(got[[0, 1, 3, 4]], want[[0, 1, 3, 4]])


@needs_vnni
def test_no_k_every_row_and_out_of_range_activations(monkeypatch: pytest.MonkeyPatch) -> None:
    """k = 0 gives no ids (the heap has no slot to read); k = the row count ranks every row exactly;
    activations whose scores would overflow float32 in the int8 pass take the float32 path; and the
    scoring kernel refuses a batch that is not whole groups of TB (it reads TB rows at a time)."""
    monkeypatch.setattr(tensor, "TILED_TOP_K_ROWS", 1)
    m = random_matrix(GGMLType.Q8_0, 37, 640, seed=12)
    x = np.random.default_rng(7).standard_normal((9, 640)).astype(np.float32)
    assert m.top_k(x, 0).shape == (9, 0)
    tiled = m.tiled()
    assert tiled is not None and topk_tiles.top_k(tiled, m.raw, x, 0).shape == (9, 0)
    assert np.array_equal(m.top_k(x, 37), _exact_top_k(m, x, 37))
    huge = x * np.float32(1e36)
    assert not topk_tiles.in_range(tiled, huge) and topk_tiles.in_range(tiled, x)
    monkeypatch.setattr(topk_tiles, "top_k", lambda *a: pytest.fail("the int8 pass took out-of-range activations"))
    assert m.top_k(huge, 3).shape == (9, 3)
    with pytest.raises(ValueError, match="whole groups of TB"):
        topk_tiles.batch_scores(tiled.packed, tiled.scales, x[:5], np.empty((5, tiled.packed.shape[0] * 16), np.float32),
                                argmax.rounding(640))
