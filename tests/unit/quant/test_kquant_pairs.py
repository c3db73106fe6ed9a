"""Two matrices in one parallel region (kquant_pairs.py): each output the one-matrix kernel's bits, for
row counts that split unevenly between the threads and rows long and short."""

from __future__ import annotations

import numpy as np
import pytest

from larql.quant import GGMLType, kquant_pairs, kquant_rows
from tests.unit.quant.test_kernels import random_matrix


@pytest.mark.parametrize("qtype", sorted(GGMLType(t) for t in kquant_pairs.PAIR), ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [(1, 1), (7, 3), (64, 33), (2, 9)], ids=lambda r: f"{r[0]}+{r[1]}")
@pytest.mark.parametrize("cols", [512, 2560, 6400])
def test_a_pair_is_each_matrix_alone(qtype: GGMLType, rows: tuple[int, int], cols: int) -> None:
    a, b = (random_matrix(qtype, n, cols, seed=n + i) for i, n in enumerate(rows))
    x = np.random.default_rng(cols).standard_normal(cols).astype(np.float32)
    x[::3] *= 100.0
    got = [np.full(m.n_rows, np.nan, np.float32) for m in (a, b)]
    kquant_pairs.PAIR[int(qtype)](a.raw, b.raw, x, *got)
    for m, out in zip((a, b), got):
        want = np.full(m.n_rows, np.nan, np.float32)
        kquant_rows.MATVEC[int(qtype)](m.raw, x, want)
        assert np.array_equal(out, want)
