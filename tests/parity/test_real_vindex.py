"""Gemma 3 270M extracted to an inference-level vindex: exact down_meta, exact KNN, same model."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import larql
from larql.vindex import open_vindex


def test_vindex_model_equals_gguf_model(gemma_vindex: Path, gemma: larql.Model) -> None:
    m = larql.load(gemma_vindex)
    ids = gemma.tokenize("The Eiffel Tower is located in the city of")
    assert np.array_equal(m.forward(ids), gemma.forward(ids))
    assert m.generate("The capital of France is", max_new_tokens=6).ids == [506, 5279, 529, 506, 2891, 529]


def test_down_meta_exact_on_sampled_features(gemma_vindex: Path, gemma: larql.Model) -> None:
    v = open_vindex(gemma_vindex)
    unembed = gemma.weights.output.dequantize()
    for layer in (0, 9, 17):
        down = gemma.weights.layers[layer].down.dequantize()  # (hidden, ffn)
        ids, vals = v.down_meta(layer)
        for f in (0, 777, 2047):
            scores = unembed.astype(np.float64) @ down[:, f].astype(np.float64)
            top = np.argsort(-scores, kind="stable")[: v.top_k]
            assert set(ids[f][:5]) <= set(np.argsort(-scores)[:6]), (layer, f)  # float32 vs float64 ties
            assert np.allclose(np.sort(vals[f])[::-1], scores[top], rtol=1e-4, atol=1e-6)


def test_knn_and_metadata_on_real_vindex(gemma_vindex: Path) -> None:
    v = open_vindex(gemma_vindex)
    assert v.verify() == []
    q = v.entity_embedding("France")
    hits = v.gate_knn(12, q, k=10)
    scores = v.gate_vectors(12).astype(np.float64) @ q.astype(np.float64)
    assert [f for f, _ in hits] == list(np.argsort(-np.abs(scores), kind="stable")[:10])
    meta = v.feature_meta(12, hits[0][0])
    assert len(meta.tokens) == v.top_k and meta.scores == tuple(sorted(meta.scores, reverse=True))
