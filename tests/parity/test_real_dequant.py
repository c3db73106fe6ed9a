"""Every tensor of both real models dequantizes bit for bit as gguf-py does."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from larql.model.gguf_file import GGUFFile
from larql.model.load import resolve
from tests.conftest import REAL_MODELS

CHUNK = 16384  # rows per comparison, to bound memory on the 262k-row embedding


@pytest.mark.parametrize("key", REAL_MODELS)
def test_every_tensor_bit_exact(key: str) -> None:
    _, path = resolve(key)
    ours = GGUFFile(path)
    theirs = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    assert set(ours.tensors) == set(theirs)
    seen_types = set()
    for name, info in ours.tensors.items():
        matrix = ours.matrix(name)
        data = np.asarray(theirs[name].data)
        seen_types.add(info.qtype.name)
        for start in range(0, matrix.n_rows, CHUNK):
            rows = slice(start, start + CHUNK)
            expected = gguf.quants.dequantize(data.reshape(matrix.n_rows, -1)[rows], theirs[name].tensor_type)
            got = matrix.dequantize(rows)
            expected = np.asarray(expected, dtype=np.float32).reshape(got.shape)
            bad = np.flatnonzero((got.view(np.uint32) != expected.view(np.uint32)).any(axis=1))
            assert bad.size == 0, f"{name} ({info.qtype.name}): {bad.size} rows differ, first {start + bad[0]}"
    expected_types = {"gemma3-270m": {"F32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}, "smollm2-135m": {"F32", "Q8_0", "Q4_1"}}
    assert seen_types == expected_types[key]
