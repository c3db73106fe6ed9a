"""The Q4_K / Q6_K quantizers write blocks that gguf-py decodes, with 4- and 6-bit-sized errors."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from larql.errors import QuantError
from larql.quant.quantize import quantize_q4_k, quantize_q6_k

CASES = [(quantize_q4_k, gguf.GGMLQuantizationType.Q4_K, 0.09), (quantize_q6_k, gguf.GGMLQuantizationType.Q6_K, 0.025)]


@pytest.mark.parametrize("fn, qtype, max_err", CASES, ids=["Q4_K", "Q6_K"])
def test_blocks_decode_and_error_is_bounded(fn, qtype, max_err) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((48, 768)) * 0.05).astype(np.float32)
    w[5] = 0.0  # an all-zero row
    w[6, :256] = 0.25  # a constant block
    m = fn(w)
    theirs = gguf.quants.dequantize(m.raw, qtype).reshape(w.shape)
    ours = m.dequantize()
    assert np.array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))
    err = np.sqrt(((ours - w) ** 2).mean() / (w**2).mean())
    assert err < max_err, err
    assert np.all(ours[5] == 0.0)
    assert np.allclose(ours[6, :256], 0.25, rtol=0.02)


def test_bad_shapes_and_values() -> None:
    with pytest.raises(QuantError, match=r"w: K-quants need rows of a multiple of 256 weights, got shape \[4, 100\]"):
        quantize_q4_k(np.zeros((4, 100), np.float32), "w")
    bad = np.zeros((2, 256), np.float32)
    bad[1, 3] = np.nan
    with pytest.raises(QuantError, match="cannot quantize non-finite weights"):
        quantize_q6_k(bad, "w")
