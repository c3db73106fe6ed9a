"""The greedy lm_head (argmax.py): the candidate pass's bound holds and the argmax is np.argmax's."""

from __future__ import annotations

import numpy as np
import pytest

from larql.quant import GGMLType, argmax, dot_kernels, kernels, q8_bounds
from tests.unit.quant.test_kernels import random_matrix

needs_vnni = pytest.mark.skipif(not argmax.HAVE_VNNI, reason="no AVX-512 VNNI: argmax_matvec is np.argmax of matmul")


def _exact(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    out = np.empty(raw.shape[0], dtype=np.float32)
    dot_kernels.matvec_q8_0(raw, raw.view(np.int8), kernels.F16_TO_F32, x, out)
    return out


@needs_vnni
def test_every_row_is_within_its_bound() -> None:
    """|A_r - F_r| <= E_r for every row: the candidate pass's scores against the float kernel's."""
    m = random_matrix(GGMLType.Q8_0, 3000, 640, seed=11)
    rng = np.random.default_rng(0)
    norms = argmax.row_norms(m.raw)
    dq = m.dequantize().astype(np.float64)
    assert np.allclose(norms, np.linalg.norm(dq, axis=1), rtol=1e-12) and np.all(norms >= np.linalg.norm(dq, axis=1))
    for scale in (0.01, 1.0, 300.0):
        x = (rng.standard_normal(640) * scale).astype(np.float32)
        x[rng.integers(0, 640, 3)] *= 50  # outlier dimensions, as in real residuals
        xu = np.empty(640, dtype=np.uint8)
        dx = np.empty(20, dtype=np.float32)
        err, hat = argmax.quantize_activation(x, xu, dx)
        xhat = ((xu.astype(np.float64) - 128).reshape(20, 32) * dx[:, None].astype(np.float64)).ravel()
        assert err == pytest.approx(np.linalg.norm(xhat - x), rel=1e-12)
        approx = np.empty(3000, dtype=np.float32)
        argmax.matvec_q8_0_q8(m.raw, xu, dx, approx)
        assert np.abs(approx - dq @ xhat).max() <= 1e-5 * np.abs(dq @ xhat).max()  # int8 dots, exact scaling
        exact = _exact(m.raw, x)
        slack = err + 1.01 * 642 * q8_bounds.U * (np.linalg.norm(x) + hat)
        assert np.all(np.abs(approx.astype(np.float64) - exact) <= norms * slack)


@needs_vnni
@pytest.mark.parametrize("seed", range(6))
def test_argmax_is_numpys(seed: int) -> None:
    m = random_matrix(GGMLType.Q8_0, 5000, 256, seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(5):
        x = rng.standard_normal(256).astype(np.float32)
        rows = argmax.candidate_rows(m.raw, argmax.row_norms(m.raw), x)
        assert rows is not None and len(rows) < 5000 and np.all(np.diff(rows) > 0)
        assert m.argmax_matvec(x) == int(np.argmax(m.matmul(x)))


@needs_vnni
def test_ties_go_to_the_lower_row_and_nonfinite_falls_back() -> None:
    m = random_matrix(GGMLType.Q8_0, 64, 128, seed=2)
    raw = m.raw.copy()
    raw[40] = raw[7]  # two identical rows: np.argmax takes row 7
    x = _dequant_row(raw, 7)
    tied = type(m)("tied", GGMLType.Q8_0, 64, 128, raw)
    assert int(np.argmax(tied.matmul(x))) == tied.argmax_matvec(x) == 7
    x[3] = np.inf
    assert argmax.candidate_rows(raw, argmax.row_norms(raw), x) is None
    assert tied.argmax_matvec(x) == int(np.argmax(tied.matmul(x)))


def _dequant_row(raw: np.ndarray, r: int) -> np.ndarray:
    from larql.quant import dequantize_reference

    return dequantize_reference(raw[r:r + 1], GGMLType.Q8_0, 128)[0].astype(np.float32)


def test_other_types_and_no_vnni_use_the_full_matvec(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(1).standard_normal(256).astype(np.float32)
    m4 = random_matrix(GGMLType.Q4_K, 300, 256, seed=4)
    assert m4.argmax_matvec(x) == int(np.argmax(m4.matmul(x)))
    monkeypatch.setattr(argmax, "HAVE_VNNI", False)
    m8 = random_matrix(GGMLType.Q8_0, 300, 256, seed=5)
    assert m8.argmax_matvec(x) == int(np.argmax(m8.matmul(x)))
