"""Relation clusters: k-means (faiss) over knowledge-band features' input -> output directions.

For a knowledge-band feature f, its *input token* is the whole word w maximising gate_f . E[w] (what
makes it fire) and its *output token* is down_meta's top token (what it writes). The direction
normalize(E[out] - E[in]) is shared by features implementing the same relation (France -> Paris and
Germany -> Berlin both point "country -> capital"), so clustering the directions groups features by
relation (LARQL §4.10 step 3-4). A cluster is labelled by the output words its members write most
often ("Paris/Berlin/Rome"): what the cluster does, read off the data, rather than a guessed name.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import faiss
import numpy as np
from numpy.typing import NDArray

from larql.vindex import topk
from larql.vindex.tokens import clean_token, is_content_token

MAX_CLUSTERS = 512
MIN_MEMBERS_PER_CLUSTER = 40  # k = n_directions // this (faiss wants ~39 points per centroid)
MAX_WORDS = 30_000  # whole-word vocabulary for input tokens (by id, the commonest first in BPE vocabularies)


@dataclass(frozen=True)
class Clusters:
    centres: NDArray[np.float32]  # (k, hidden), unit vectors
    labels: list[str]
    counts: list[int]
    top_tokens: list[list[str]]
    members: list[tuple[int, int, int]]  # (layer, feature, cluster)

    def to_json(self) -> dict[str, object]:
        return {"k": len(self.labels), "centres": self.centres.round(6).tolist(), "labels": self.labels,
                "counts": self.counts, "top_tokens": self.top_tokens}


def whole_words(token_texts: list[str]) -> NDArray[np.int64]:
    """Ids of word-initial content tokens (" Paris", "▁Paris"), at most MAX_WORDS of them."""
    ids = [i for i, t in enumerate(token_texts) if t[:1] in (" ", "▁") and is_content_token(t)]
    return np.array(ids[:MAX_WORDS], dtype=np.int64)


def word_rows(embeddings: NDArray[np.float32], words: NDArray[np.int64]) -> topk.Tokens:
    """The whole words' embedding rows, prepared once for every layer's `layer_directions`."""
    return topk.prepare(np.ascontiguousarray(embeddings[words], dtype=np.float32))


def layer_directions(embeddings: NDArray[np.float32], token_texts: list[str], words: NDArray[np.int64],
                     word_emb: topk.Tokens, layer: int, gate: NDArray[np.float32], top_out: NDArray[np.uint32]
                     ) -> tuple[NDArray[np.float16], list[tuple[int, int]], list[str]]:
    """One layer's unit directions normalize(E[out] - E[in]) (as f16), their (layer, feature), outputs.
    word_emb: `word_rows(embeddings, words)`."""
    # (ffn,) the word that fires each feature most: the exact argmax (first word on a tie), by
    # down_meta's bounded pass, a quarter of the float32 GEMM's time with VNNI
    inputs = words[topk.top_tokens(word_emb, gate, 1)[0][:, 0]]
    directions, members, outputs = [], [], []
    for f in range(gate.shape[0]):
        out_id = int(top_out[f])
        out_text = token_texts[out_id]
        # only features that write a whole word: on small models most outputs are subword debris
        if out_text[:1] not in (" ", "▁") or not is_content_token(out_text) or out_id == inputs[f]:
            continue
        d = embeddings[out_id].astype(np.float32) - embeddings[inputs[f]].astype(np.float32)
        norm = float(np.linalg.norm(d))
        if norm > 0:
            directions.append(d / norm)
            members.append((layer, f))
            outputs.append(clean_token(token_texts[out_id]))
    dirs = np.array(directions, dtype=np.float16).reshape(len(directions), embeddings.shape[1])
    return dirs, members, outputs


def cluster_directions(directions: NDArray[np.float16], members: list[tuple[int, int]], outputs: list[str],
                       seed: int = 1) -> Clusters | None:
    """Spherical k-means over the directions; None when there are too few to cluster."""
    k = min(MAX_CLUSTERS, len(directions) // MIN_MEMBERS_PER_CLUSTER)
    if k < 2:
        return None
    x = np.ascontiguousarray(directions, dtype=np.float32)
    km = faiss.Kmeans(x.shape[1], k, niter=25, seed=seed, spherical=True, verbose=False)
    km.train(x)
    _, assign = km.index.search(x, 1)
    assign = assign[:, 0]
    labels, counts, top_tokens = [], [], []
    for c in range(k):
        words_c = Counter(outputs[i] for i in np.flatnonzero(assign == c))
        common = [w for w, _ in words_c.most_common(5)]
        top_tokens.append(common)
        labels.append("/".join(common[:3]) if common else f"cluster-{c}")
        counts.append(int(sum(words_c.values())))
    assert km.centroids is not None  # set by train()
    return Clusters(km.centroids.astype(np.float32), labels, counts, top_tokens,
                    [(layer, f, int(c)) for (layer, f), c in zip(members, assign)])
