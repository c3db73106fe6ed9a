"""Decode's direct matvec over the GGUF blocks (kquant_rows.py) against the float64 product of the
numpy reference dequantization, for every type it covers: shapes whose column count is a multiple of
256 but not of 512 (an odd number of k-quant blocks: the unpaired last block), Q4_0 / Q5_0 rows of an
odd number of blocks, one-row and odd-row matrices, extreme scales; and that the bound is tight enough to
see a single wrong weight; and that the several-rows kernels give each row the one-row kernel's bits."""

from __future__ import annotations

import platform
import re

import numpy as np
import pytest
from numba import njit

from larql.quant import BLOCK_LAYOUT, GGMLType, QuantMatrix, dequantize_reference, kquant_rows, tensor
from tests.unit.quant.test_kernels import random_matrix

TYPES = sorted(GGMLType(t) for t in kquant_rows.MATVEC)
# (7, 6400) and (5, 6144): rows of LONG_ROW weights or more, which the AVX-512 kernels take several a call
SHAPES = [(70, 512), (1, 256), (5, 768), (33, 2304), (3, 2560), (7, 96), (3, 1184), (7, 6400), (5, 6144)]
# first byte of the quantized integers in a block (after the scales), per type
_QS = {GGMLType.Q4_K: 16, GGMLType.Q5_K: 48, GGMLType.Q6_K: 0, GGMLType.Q4_0: 2, GGMLType.Q5_0: 6}


def _bound(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A float32 dot product's error bound, summed in any order: ~sqrt(n) ulps of the sum of |products|."""
    return 4e-7 * w.shape[1] ** 0.5 * (np.abs(w) @ np.abs(x)) + 1e-30


def _product(m: QuantMatrix, x: np.ndarray) -> np.ndarray:
    out = np.full(m.n_rows, np.nan, dtype=np.float32)
    kquant_rows.MATVEC[int(m.qtype)](m.raw, x, out)
    return out


# each type with the shapes its block size allows (96 and 1184 columns hold no whole 256-weight block)
CASES = [(t, s) for t in TYPES for s in SHAPES if s[1] % BLOCK_LAYOUT[t][0] == 0]


@pytest.mark.parametrize(("qtype", "shape"), CASES, ids=lambda c: c.name if isinstance(c, GGMLType) else f"{c[0]}x{c[1]}")
def test_direct_matvec_is_the_exact_product(qtype: GGMLType, shape: tuple[int, int]) -> None:
    rows, cols = shape
    m = random_matrix(qtype, rows, cols, seed=rows * 7 + int(qtype))
    w = dequantize_reference(m.raw, qtype, cols).astype(np.float64)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(cols).astype(np.float32)
        if seed == 2:
            x[::3] *= 1000.0  # activations of very different sizes (Gemma's residual has outliers)
        got = _product(m, x)
        want = w @ x.astype(np.float64)
        assert np.all(np.abs(got - want) <= _bound(w, x.astype(np.float64))), qtype.name


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_one_wrong_weight_is_seen(qtype: GGMLType) -> None:
    """The bound above rejects the product of weights that differ in one bit of one integer, in every
    block position tried: a kernel that read one sub-block's bits or scale wrong would fail it."""
    rows, cols = 4, 768
    m = random_matrix(qtype, rows, cols, seed=11)
    rng = np.random.default_rng(3)
    x = (rng.choice([-1.0, 1.0], cols) * rng.uniform(0.5, 1.5, cols)).astype(np.float32)
    got = _product(m, x)
    block_weights, block_bytes = BLOCK_LAYOUT[qtype]
    for block in (0, cols // block_weights - 1):
        for byte in (0, 5, 15):
            raw = m.raw.copy()
            raw[1, block * block_bytes + _QS[qtype] + byte] ^= 0x04  # one weight's integer, by 4
            w = dequantize_reference(raw, qtype, cols).astype(np.float64)
            if np.array_equal(w, dequantize_reference(m.raw, qtype, cols)):
                continue  # that weight's scale is 0
            assert not np.all(np.abs(got - w @ x.astype(np.float64)) <= _bound(w, x.astype(np.float64)))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_takes_the_direct_kernel_without_a_repacked_copy(qtype: GGMLType,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With no repacking budget, one activation goes to the direct kernel (not dot_kernels'), the same
    bits as calling it."""
    monkeypatch.setattr(tensor, "_repack_budget", [0])
    m = random_matrix(qtype, 9, 512, seed=2)
    x = np.random.default_rng(1).standard_normal(512).astype(np.float32)
    assert m.repacked() is None
    assert np.array_equal(m.matmul(x), _product(m, x))
    vec = m.vector_kernel()
    assert vec is not None and getattr(vec, "func", None) is kquant_rows.MATVEC[int(qtype)]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 assembly")
@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q6_K], ids=lambda t: t.name)
def test_the_unpacking_vectorizes(qtype: GGMLType) -> None:
    """The row kernel converts its integers to float32 a vector at a time (cvtdq2ps on xmm / ymm / zmm
    registers), never one by one (a scalar cvtsi2ss would mean the unpacking fell out of vector
    registers): checked on a serial, uncached copy of the wrapper (numba shows no cached code's asm)."""
    kernel = kquant_rows.MATVEC[int(qtype)]
    serial = njit(kernel.py_func)
    m = random_matrix(qtype, 2, 256)
    serial(m.raw, np.zeros(256, np.float32), np.empty(2, np.float32))
    asm = "\n".join(serial.inspect_asm().values())
    assert re.search(r"cvtdq2ps\s+%[xyz]mm", asm) and "cvtsi2ss" not in asm


# each type's one-row form with its integers converted as on AVX2 (shifts, masks, cvtdq2ps)
ONE_ROW = {GGMLType.Q4_K: kquant_rows.matvec_q4_k_one, GGMLType.Q6_K: kquant_rows.matvec_q6_k_one,
           GGMLType.Q5_0: kquant_rows.matvec_q5_0_one}


@pytest.mark.parametrize("qtype", list(ONE_ROW), ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(1, 6144), (2, 6144), (3, 6400), (5, 6400), (8, 6144), (9, 6656), (13, 2560), (6, 6400)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_several_rows_a_call_are_the_one_row_bits(qtype: GGMLType, shape: tuple[int, int]) -> None:
    """The decode kernels (on AVX-512: long rows several a call, integers to float32 by permutes, the
    exponent trick and masked adds) equal the one-row AVX2 forms bit for bit, at row counts that leave
    a remainder of one to three rows."""
    rows, cols = shape
    m = random_matrix(qtype, rows, cols, seed=rows + cols)
    one = ONE_ROW[qtype]
    for seed in range(2):
        x = np.random.default_rng(seed).standard_normal(cols).astype(np.float32)
        x[::5] *= 300.0
        want = np.full(rows, np.nan, dtype=np.float32)
        one(m.raw, x, want)
        assert np.array_equal(_product(m, x), want)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not kquant_rows.WIDE, reason="AVX-512 assembly")
def test_avx512_q4_k_takes_nibbles_by_permute() -> None:
    """On an AVX-512 target the Q4_K kernel turns nibbles into float32 by a 16-lane permute (vpermps, or
    vpermd: the same bits) of the table 0..15, not by mask and conversion."""
    serial = njit(kquant_rows.matvec_q4_k.py_func)
    m = random_matrix(GGMLType.Q4_K, 2, 256)
    serial(m.raw, np.zeros(256, np.float32), np.empty(2, np.float32))
    asm = "\n".join(serial.inspect_asm().values())
    assert re.search(r"vperm[dp]s?\s+%zmm\d+, %zmm\d+, %zmm\d+", asm)
