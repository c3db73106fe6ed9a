"""down_meta's top-k on Gemma 3 270M's own layers, over its whole 262,144-token vocabulary: each
tier this CPU and numba's target run (the AVX2 kernel, with its 7-bit feature codes, runs on any
AVX2 CPU) against a float64 brute force, and the bound on its own: after the approximate pass no
true top-k token is ruled out."""

from __future__ import annotations

import numpy as np
import pytest

import larql
from larql.quant import isa
from larql.vindex import topk
from tests.unit.vindex.test_down_topk import assert_bound_holds

K = 10
LAYERS = (0, 8, 17)
PATHS = [pytest.param(t, marks=pytest.mark.skipif(not isa.runs(t), reason=f"tier {isa.TIER}: no {t}"))
         for t in isa.TIERS]


@pytest.fixture(scope="module")
def unembed(gemma: larql.Model) -> np.ndarray:
    return gemma.weights.output.dequantize()


@pytest.fixture(scope="module")
def features(gemma: larql.Model) -> dict[int, np.ndarray]:
    """Per layer, rows of W_down^T: the 8 of largest norm (the widest bounds) and 32 at random."""
    rng = np.random.default_rng(0)
    out = {}
    for layer in LAYERS:
        wt = gemma.weights.layers[layer].down.dequantize().T
        norms = np.linalg.norm(wt, axis=1)
        pick = np.concatenate([np.argsort(-norms)[:8], rng.choice(len(wt), 32, replace=False)])
        out[layer] = np.ascontiguousarray(wt[pick], dtype=np.float32)
    return out


@pytest.fixture(scope="module")
def truth(unembed: np.ndarray, features: dict[int, np.ndarray]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """float64 scores rounded to float32, ranked by value descending then id ascending."""
    out = {}
    for layer, wt in features.items():
        w64 = wt.astype(np.float64)
        s = np.empty((len(wt), len(unembed)), np.float32)
        for a in range(0, len(unembed), 16384):
            s[:, a:a + 16384] = (w64 @ unembed[a:a + 16384].astype(np.float64).T).astype(np.float32)
        ids = np.stack([np.lexsort((np.arange(s.shape[1]), -row))[:K] for row in s])
        out[layer] = ids, np.take_along_axis(s, ids, axis=1)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("tier", PATHS)
def test_real_layers_match_float64(tier: str, unembed: np.ndarray, features: dict[int, np.ndarray],
                                   truth: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
    tok = topk.prepare(unembed, tier=tier)
    for layer, wt in features.items():
        rid, rval = truth[layer]
        assert_bound_holds(tok, wt, K, rid, rval)
        ids, vals = topk.top_tokens(tok, wt, K)
        bad = np.flatnonzero((ids != rid).any(axis=1) | (vals != rval).any(axis=1))
        assert len(bad) == 0, f"layer {layer} features {bad[:5]}: {ids[bad[:1]]} != {rid[bad[:1]]}"
