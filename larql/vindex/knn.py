"""Gate KNN with faiss: exact top-k features by |gate . query|, sign kept.

faiss's flat inner-product index returns the largest scores; searching with q and with -q gives
the k most positive and the k most negative, and the k largest by magnitude are among those 2k.
Per-layer indexes are built on first use and kept by the store (`Vindex.gate_index`). An f16 vindex uses faiss's fp16 scalar
quantizer fed the stored half-precision bytes directly: decoding fp16 is exact, it reads half the
memory of a float32 copy, and it measured 3.8 ms against 6.6 ms per Gemma-3-4B-sized layer here.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

import faiss
import numpy as np
from numpy.typing import NDArray

from larql.errors import VindexError

if TYPE_CHECKING:
    from larql.vindex.store import Vindex


def build_index(gates: NDArray[np.floating]) -> faiss.Index:
    """A flat inner-product index over gate vectors `(features, hidden)` in their stored dtype."""
    hidden = gates.shape[1]
    index: faiss.Index
    if gates.dtype == np.float16:
        index = faiss.IndexScalarQuantizer(hidden, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        index.add_sa_codes(np.ascontiguousarray(gates).view(np.uint8))
    else:
        index = faiss.IndexFlatIP(hidden)
        index.add(np.ascontiguousarray(gates, dtype=np.float32))
    return index


def gate_knn(v: Vindex, layer: int, query: NDArray[np.float32], k: int = 10,
             gates: Mapping[int, NDArray[np.float32]] | None = None,
             deleted: AbstractSet[int] = frozenset()) -> list[tuple[int, float]]:
    """[(feature, score)] for the k largest |score| at `layer`, sorted by |score| descending.

    `gates` (feature -> replacement gate vector) and `deleted` are an editable view's edits of the
    layer: edited features are rescored with their new gate, deleted ones never returned.
    """
    n = v.num_features(layer)
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    if q.shape[0] != v.hidden:
        raise VindexError(f"gate KNN query has {q.shape[0]} values; this vindex's hidden size is {v.hidden}")
    if k < 1:
        raise VindexError(f"gate KNN needs k >= 1, got {k}")
    k = min(k, n)
    edited = gates or {}
    # with edits: search wider, rescore overridden gates, drop deleted features, re-rank
    wide = min(n, k + len(edited) + len(deleted))
    both = np.stack([q, -q])  # (2, hidden)
    scores, ids = v.gate_index(layer).search(both, wide)  # (2, wide) each
    cand_ids = np.concatenate([ids[0], ids[1]])
    cand_scores = np.concatenate([scores[0], -scores[1]])
    keep = cand_ids >= 0
    cand_ids, cand_scores = cand_ids[keep], cand_scores[keep]
    _, first = np.unique(cand_ids, return_index=True)  # a feature can appear in both lists when n < 2k
    cand_ids, cand_scores = cand_ids[first], cand_scores[first]
    if edited or deleted:
        rescored = {int(f): float(s) for f, s in zip(cand_ids, cand_scores)}
        for f, gate in edited.items():
            rescored[f] = float(gate @ q)
        for f in deleted:
            rescored.pop(f, None)
        cand_ids = np.fromiter(rescored, dtype=np.int64, count=len(rescored))
        cand_scores = np.fromiter(rescored.values(), dtype=np.float64, count=len(rescored))
    order = np.lexsort((cand_ids, -np.abs(cand_scores)))[:k]
    return [(int(cand_ids[i]), float(cand_scores[i])) for i in order]
