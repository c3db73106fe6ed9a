"""The tiled candidate pass (argmax_tiles.py): the same bound as argmax.py's, and the greedy lm_head
it serves returns exactly np.argmax of the full float32 matvec, near-ties and partial tiles included."""

from __future__ import annotations

import numpy as np
import pytest

import larql
from larql.quant import (
    GGMLType,
    QuantMatrix,
    argmax,
    argmax_tiles,
    dequantize_reference,
    dot_kernels,
    kernels,
    q8_bounds,
)
from tests.unit.quant.test_kernels import random_matrix

needs_vnni = pytest.mark.skipif(not argmax.HAVE_VNNI, reason="no AVX-512 VNNI: argmax_matvec is np.argmax of matmul")
needs_tiled = pytest.mark.skipif(not argmax.HAVE_TILED, reason="float32 tier: no int8 candidate pass")


def _exact(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    out = np.empty(raw.shape[0], dtype=np.float32)
    dot_kernels.matvec_q8_0(raw, raw.view(np.int8), kernels.F16_TO_F32, x, out)
    return out


def _c(n: int) -> float:
    return 1.01 * (n + 2) * q8_bounds.U


@needs_vnni
@pytest.mark.parametrize("rows", [3000, 1029])  # 1029: a partial last tile
def test_tiled_scores_are_within_the_bound(rows: int) -> None:
    """|A_r - F_r| <= E_r for every row, A from the tiled kernel; and A is argmax.py's A up to rounding."""
    m = random_matrix(GGMLType.Q8_0, rows, 640, seed=rows)
    norms = argmax.row_norms(m.raw)
    tiled = argmax_tiles.Tiled(m.raw, norms)
    rng = np.random.default_rng(1)
    for scale in (0.01, 1.0, 300.0):
        x = (rng.standard_normal(640) * scale).astype(np.float32)
        x[rng.integers(0, 640, 3)] *= 50
        approx = np.empty(tiled.packed.shape[0] * argmax_tiles.ROWS, dtype=np.float32)
        argmax_tiles.scores(tiled.packed, tiled.scales, rows, x, approx)
        xu, dx = np.empty(640, dtype=np.uint8), np.empty(20, dtype=np.float32)
        err, hat = argmax.quantize_activation(x, xu, dx)
        old = np.empty(rows, dtype=np.float32)
        argmax.matvec_q8_0_q8(m.raw, xu, dx, old)
        assert np.abs(approx[:rows] - old).max() <= 1e-5 * np.abs(old).max()
        slack = err + _c(640) * (np.linalg.norm(x) + hat)
        assert np.all(np.abs(approx[:rows].astype(np.float64) - _exact(m.raw, x)) <= norms * slack)


@needs_tiled
@pytest.mark.parametrize("rows", [3000, 1029])
def test_avx2_scores_within_the_bound_and_vnnis(rows: int) -> None:
    """The AVX2 kernel (it runs on either int8 tier): |A_r - F_r| <= E_r for every row, the same A
    as the VNNI kernel bit for bit where that runs, and the same candidates; a row of codes -128
    (which vpsignb cannot negate: the weight's sign moves to the activation) and one of +-127 against
    an activation block of -+127 (the largest int16 pairs)."""
    m = random_matrix(GGMLType.Q8_0, rows, 640, seed=rows)
    raw = m.raw.copy()
    blocks = raw.reshape(rows, 20, 34)
    blocks[7, :, 2:] = 0x80  # every code -128
    blocks[8, :, 2:] = np.where(np.arange(32) % 2, 127, 0x81)  # +127, -127 in turn
    norms = argmax.row_norms(raw)
    tiled = argmax_tiles.Tiled(raw, norms)
    rng = np.random.default_rng(2)
    for scale in (0.01, 1.0, 300.0):
        x = (rng.standard_normal(640) * scale).astype(np.float32)
        x[rng.integers(0, 640, 3)] *= 50
        x[:32] = np.where(np.arange(32) % 2, -1.0, 1.0) * scale  # codes -127, 127 against row 8's
        approx = np.empty(tiled.packed.shape[0] * argmax_tiles.ROWS, dtype=np.float32)
        argmax_tiles.scores_avx2(tiled.packed, tiled.scales, rows, x, approx)
        xu, dx = np.empty(640, dtype=np.uint8), np.empty(20, dtype=np.float32)
        err, hat = argmax.quantize_activation(x, xu, dx)
        slack = err + _c(640) * (np.linalg.norm(x) + hat)
        assert np.all(np.abs(approx[:rows].astype(np.float64) - _exact(raw, x)) <= norms * slack)
        if argmax.HAVE_VNNI:
            vnni = np.empty_like(approx)
            argmax_tiles.scores(tiled.packed, tiled.scales, rows, x, vnni)
            assert np.array_equal(approx, vnni)
            got = argmax_tiles.candidates_avx2(tiled.packed, tiled.scales, rows, x, norms, tiled.chunk_norm, _c(640))
            want = argmax_tiles.candidates(tiled.packed, tiled.scales, rows, x, norms, tiled.chunk_norm, _c(640))
            assert np.array_equal(got, want)


@needs_tiled
def test_tile_layout() -> None:
    """packed[t, 512 k + 64 g + 4 i + m] = q[16 t + i, 32 k + 4 g + m] + 128, scales the f16 bits."""
    m = random_matrix(GGMLType.Q8_0, 21, 64, seed=3)
    t = argmax_tiles.Tiled(m.raw, argmax.row_norms(m.raw))
    q = m.raw.reshape(21, 2, 34)[:, :, 2:].view(np.int8).astype(np.int32).reshape(21, 64)
    for r in (0, 5, 15, 16, 20):
        for col in (0, 3, 31, 32, 63):
            k, g, mm = col // 32, (col % 32) // 4, col % 4
            assert t.packed[r // 16, 512 * k + 64 * g + 4 * (r % 16) + mm] == q[r, col] + 128
    d = m.raw.reshape(21, 2, 34)[:, :, :2].copy().view(np.uint16)[:, :, 0]
    assert np.array_equal(t.scales[0].reshape(2, 16).T, d[:16])
    assert np.all(t.packed[1].reshape(2, 8, 16, 4)[:, :, 5:] == 128) and np.all(t.scales[1].reshape(2, 16)[:, 5:] == 0)


def _matrix_of(rows: np.ndarray) -> QuantMatrix:
    """Q8_0 blocks for float rows `[r, n]` (as llama.cpp quantizes: d = max|w| / 127 per 32, as f16)."""
    r, n = rows.shape
    w = rows.astype(np.float32).reshape(r, n // 32, 32)
    d = (np.abs(w).max(axis=2) / 127).astype(np.float16)
    inv = np.where(d > 0, 1 / np.maximum(d.astype(np.float32), 1e-30), 0)
    q = np.clip(np.rint(w * inv[:, :, None]), -127, 127).astype(np.int8)
    raw = np.concatenate([d[:, :, None].view(np.uint8), q.view(np.uint8)], axis=2).reshape(r, -1)
    return QuantMatrix("t", GGMLType.Q8_0, r, n, np.ascontiguousarray(raw))


@needs_tiled
@pytest.mark.parametrize("seed", range(4))
def test_near_ties_give_numpys_argmax(seed: int) -> None:
    """Many rows whose exact logits differ in the last bits (one code moved where x is tiny, some
    rows identical), spread over tiles and chunks, with a partial last tile and every logit
    negative (a padded row's A = 0 must not win): the index is np.argmax's, every time."""
    rng = np.random.default_rng(seed)
    n, rows = 256, 2 * argmax_tiles.CHUNK * argmax_tiles.ROWS + 37
    base = rng.standard_normal(n).astype(np.float32)
    w = np.tile(base, (rows, 1)) + rng.standard_normal((rows, n)).astype(np.float32) * 0.5
    m = _matrix_of(w)
    raw = m.raw.copy()
    best = int(np.argmax(_exact(raw, base)))
    for r in rng.choice(rows, 40, replace=False):  # near-copies of the best row
        raw[r] = raw[best]
        block, j = divmod(int(rng.integers(0, n)), 32)
        code = raw[r, 34 * block + 2 + j].view(np.int8)
        raw[r, 34 * block + 2 + j] = np.int8(code + (1 if code < 127 else -1)).view(np.uint8)
    for r in rng.choice(rows, 5, replace=False):  # exact copies: the lowest index must win
        raw[r] = raw[best]
    tied = QuantMatrix("t", GGMLType.Q8_0, rows, n, raw)
    for x in (base, base + rng.standard_normal(n).astype(np.float32) * 1e-3, -base):
        x = x.astype(np.float32)
        x[rng.integers(0, n, 8)] *= np.float32(1e-6)  # dimensions where a moved code barely matters
        want = int(np.argmax(tied.matmul(x)))
        assert tied.argmax_matvec(x) == want
        tiled = tied.tiled()
        assert tiled is not None
        assert want in tiled.candidates(x, _c(n))
    neg = -np.abs(w) - 1.0  # every logit of a positive x negative
    mn = _matrix_of(neg)
    x = np.abs(rng.standard_normal(n)).astype(np.float32)
    assert mn.argmax_matvec(x) == int(np.argmax(mn.matmul(x)))


@needs_tiled
def test_identical_rows_take_the_lowest_index() -> None:
    m = random_matrix(GGMLType.Q8_0, 4000, 128, seed=9)
    raw = m.raw.copy()
    for r in (3999, 2100, 17, 1500):
        raw[r] = raw[1024]
    t = QuantMatrix("t", GGMLType.Q8_0, 4000, 128, raw)
    x = dequantize_reference(raw[1024:1025], GGMLType.Q8_0, 128)[0].astype(np.float32)
    assert int(np.argmax(t.matmul(x))) == t.argmax_matvec(x) == 17


def test_no_budget_or_other_types_use_the_row_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from larql.quant import tensor

    monkeypatch.setattr(tensor, "_repack_budget", [0])
    m = random_matrix(GGMLType.Q8_0, 500, 256, seed=6)
    x = np.random.default_rng(2).standard_normal(256).astype(np.float32)
    assert m.argmax_matvec(x) == int(np.argmax(m.matmul(x)))
    assert m.tiled() is None


@needs_tiled
def test_real_gemma_hidden_states(gemma: larql.Model) -> None:
    """Gemma 3's 262,144 x 640 tied embedding and the final-norm states of every position of two
    prompts: the tiled pass's argmax is np.argmax of the full float32 logits each time, and the
    bound lets a handful of rows through."""
    from larql.model.segments import Segment

    out = gemma.weights.output
    out.argmax_matvec(np.zeros(out.n_cols, np.float32))  # row norms, then the tiled copy
    tiled = out.tiled()
    assert tiled is not None
    for text in ("The capital of France is", "def fibonacci(n):\n    return"):
        ids = np.asarray(gemma.tokenize(text))
        x = gemma._forward.run([Segment(0, len(ids), gemma.new_cache(len(ids)), 0)], ids, None)  # (T, hidden)
        h = gemma._forward.final_norm(x, None, 0)
        for row in np.ascontiguousarray(h, dtype=np.float32):
            want = int(np.argmax(out.matmul(row)))
            assert out.argmax_matvec(row) == want
            rows = tiled.candidates(row, _c(out.n_cols))
            assert want in rows and len(rows) <= 50


@needs_tiled
def test_the_copy_is_made_once_a_generation_is_long() -> None:
    """No tiled copy for the first TILE_AFTER_STEPS greedy steps (a short run does not pay for it),
    then made, and every step's id is np.argmax of the full matvec before and after."""
    from larql.quant.tensor import TILE_AFTER_STEPS

    m = random_matrix(GGMLType.Q8_0, 3000, 256, seed=12)
    rng = np.random.default_rng(5)
    for step in range(TILE_AFTER_STEPS + 3):
        x = rng.standard_normal(256).astype(np.float32)
        assert m.argmax_matvec(x) == int(np.argmax(m.matmul(x)))
        assert bool(m._tiled) == (step >= TILE_AFTER_STEPS), step
    assert m._tiled[0] is not None


@needs_tiled
def test_the_copy_can_be_asked_for_before_any_greedy_step() -> None:
    """tiled() first (as `larql bench`'s warm-up may): it makes the row norms it needs, not a None."""
    m = random_matrix(GGMLType.Q8_0, 700, 128, seed=14)
    tiled = m.tiled()
    assert tiled is not None
    x = np.random.default_rng(3).standard_normal(128).astype(np.float32)
    assert m.argmax_matvec(x) == int(np.argmax(m.matmul(x)))
    assert m.tiled() is tiled
