"""Decode's repacked matvec (matvec_rows.py): the float64 product of the exact weights to float32
rounding, for every repackable type, odd group counts (the unpaired last group) and tiny matrices
(the prefetch past the last row reads nothing it may not)."""

from __future__ import annotations

import numpy as np
import pytest

from larql.quant import GGMLType, matvec_rows, repack, tensor
from tests.unit.quant.test_kernels import gguf_dequant, random_matrix


@pytest.mark.parametrize("qtype", sorted(repack.REPACKABLE), ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(70, 512), (1, 256), (5, 768), (33, 256)])
def test_matvec_matches_the_exact_product(qtype: GGMLType, shape: tuple[int, int],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensor, "REPACK_DIRECT", True)  # the types decode reads directly too
    rows, cols = shape
    if cols % 256 and qtype in (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K):
        pytest.skip("K-quants hold 256 columns a block")
    m = random_matrix(qtype, rows, cols, seed=rows + int(qtype))
    p = m.repacked()
    assert p is not None
    w = gguf_dequant(m).astype(np.float64)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(cols).astype(np.float32)
        out = repack.matmul(p, x[None])[0]
        want = w @ x.astype(np.float64)
        scale = np.abs(w) @ np.abs(x.astype(np.float64))  # the sum of |products|: a float32 sum's error scale
        assert np.all(np.abs(out - want) <= 4e-7 * cols ** 0.5 * scale + 1e-30), qtype.name


def test_odd_group_count_uses_every_group() -> None:
    """96 columns: three groups of 32, the last one unpaired (the kernel takes groups two at a time)."""
    q = np.zeros((2, 96), dtype=np.int8)
    q[:, 64:] = 1
    scale = np.ones((2, 3), dtype=np.float32)
    x = np.ones(96, dtype=np.float32)
    out = np.empty(2, dtype=np.float32)
    matvec_rows.matvec_g32(q, scale, x, out)
    assert out.tolist() == [32.0, 32.0]
    offset = np.full((2, 3), 0.5, dtype=np.float32)
    matvec_rows.matvec_g32_offset(q, scale, offset, x, out)
    assert out.tolist() == [32.0 + 48.0, 32.0 + 48.0]
    q16 = np.ones((1, 96), dtype=np.int8)
    s16 = np.arange(1, 7, dtype=np.float32)[None]
    matvec_rows.matvec_g16(q16, s16, x, out[:1])
    assert out[0] == 16.0 * s16.sum()
