"""The prefill path's dequantizers (dequant_rows.py) against the numpy reference and gguf-py, bit for
bit: every type they cover, whole and in row ranges; and that they run in vector registers (the reason
they exist)."""

from __future__ import annotations

import platform
import re

import numpy as np
import pytest
from numba import njit

from larql.quant import BLOCK_LAYOUT, GGMLType, dequant_rows, dequantize_reference, kernels
from tests.unit.quant.test_kernels import gguf_dequant, random_matrix

TYPES = sorted(GGMLType(t) for t in dequant_rows.DEQUANTIZE)
# an odd number of blocks a row (k-quants: 3 x 256, legacy: 3 x 32 and 23 x 32), one row, many rows
SHAPES = [(37, 768), (1, 256), (130, 96), (9, 736), (300, 512)]
CASES = [(t, s) for t in TYPES for s in SHAPES if s[1] % BLOCK_LAYOUT[t][0] == 0]


def _ids(c: object) -> str:
    return c.name if isinstance(c, GGMLType) else f"{c[0]}x{c[1]}"  # type: ignore[index]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize(("qtype", "shape"), CASES, ids=_ids)
def test_each_kernel_is_the_exact_dequantization(qtype: GGMLType, shape: tuple[int, int]) -> None:
    rows, cols = shape
    m = random_matrix(qtype, rows, cols, seed=rows + int(qtype))
    out = np.full((rows, cols), np.nan, np.float32)
    dequant_rows.DEQUANTIZE[int(qtype)](m.raw, m.raw.view(np.int8), kernels.F16_TO_F32, out)
    assert _same_bits(out, dequantize_reference(m.raw, qtype, cols))
    assert _same_bits(out, gguf_dequant(m).astype(np.float32))


# where each type's f16 fields are in a block (d, and dmin / m)
_HALVES = {GGMLType.Q8_0: [0], GGMLType.Q4_0: [0], GGMLType.Q5_0: [0], GGMLType.Q4_1: [0, 2],
           GGMLType.Q4_K: [0, 2], GGMLType.Q5_K: [0, 2], GGMLType.Q6_K: [208]}


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_byte_value_and_scale_sign(qtype: GGMLType) -> None:
    """Blocks whose other bytes run through all 256 values (every nibble, fifth and sixth bit, 6-bit
    and int8 scale) under f16 fields that are negative, zero, subnormal and large."""
    block_weights, block_bytes = BLOCK_LAYOUT[qtype]
    n_blocks = 64 * 4
    raw = (np.arange(n_blocks * block_bytes) * 7 % 256).astype(np.uint8).reshape(n_blocks, block_bytes)
    halves = np.array([-0.5, 0.0, 2.0 ** -20, 3.0, 1000.0], np.float16).view(np.uint8).reshape(-1, 2)
    for i, off in enumerate(_HALVES[qtype]):
        raw[:, off:off + 2] = halves[(np.arange(n_blocks) + i) % len(halves)]
    raw = raw.reshape(64, 4 * block_bytes)
    out = np.empty((64, 4 * block_weights), np.float32)
    dequant_rows.DEQUANTIZE[int(qtype)](raw, raw.view(np.int8), kernels.F16_TO_F32, out)
    assert _same_bits(out, dequantize_reference(raw, qtype, 4 * block_weights))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 assembly")
@pytest.mark.parametrize("qtype", [GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K], ids=lambda t: t.name)
def test_the_kernels_convert_a_vector_at_a_time(qtype: GGMLType) -> None:
    """Each kernel's loop converts bytes to float32 in vector registers (cvtdq2ps on ymm / zmm): the
    inner loops are not unrolled into one conversion per weight. Checked on a serial, uncached copy
    (numba shows no cached code's asm)."""
    kernel = dequant_rows.DEQUANTIZE[int(qtype)]
    counts = getattr(kernel, "args", ())  # a kernel bound to its loop count by functools.partial
    serial = njit(getattr(kernel, "func", kernel).py_func)
    m = random_matrix(qtype, 2, 256)
    serial(*counts, m.raw, m.raw.view(np.int8), kernels.F16_TO_F32, np.empty(m.shape, np.float32))
    asm = "\n".join(serial.inspect_asm().values())
    assert re.search(r"cvtdq2ps\s+[^\n]*%[yz]mm", asm)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_quant_matrix_dequantize_takes_these_kernels(qtype: GGMLType, monkeypatch: pytest.MonkeyPatch) -> None:
    """QuantMatrix.dequantize runs dequant_rows' kernel for a covered type, not the generic one."""
    def generic(*args: object) -> None:
        raise AssertionError("took kernels.dequantize_rows")

    monkeypatch.setattr(kernels, "dequantize_rows", generic)
    m = random_matrix(qtype, 3, 256)
    assert _same_bits(m.dequantize(slice(1, 3)), gguf_dequant(m).astype(np.float32)[1:3])
