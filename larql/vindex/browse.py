"""WALK, NEAREST TO and SELECT over edges / features / entities, as result values (reference §4.2-4.3).

Rows are plain frozen dataclasses; the LQL layer renders them. Filters take Python values already
parsed from LQL (the LQL issue maps WHERE clauses onto these arguments).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from larql.errors import VindexError
from larql.vindex.tokens import STOP_WORDS, clean_token

if TYPE_CHECKING:
    from larql.vindex.reader import VindexReader


@dataclass(frozen=True)
class FeatureHit:
    """One feature: where it is, how strongly the query drives it, what it writes."""

    layer: int
    feature: int
    score: float  # gate score for WALK / NEAREST, c_score (top output score) for scans
    top_token: str
    down_tokens: tuple[str, ...]


@dataclass(frozen=True)
class WalkResult:
    prompt: str
    token: str  # the last prompt token, whose embedding is the query
    token_id: int
    layers: tuple[int, ...]
    hits: tuple[FeatureHit, ...]  # per layer, strongest |gate| first

    def by_layer(self) -> dict[int, list[FeatureHit]]:
        out: dict[int, list[FeatureHit]] = {layer: [] for layer in self.layers}
        for h in self.hits:
            out[h.layer].append(h)
        return out


@dataclass(frozen=True)
class EntityCount:
    token: str
    count: int
    max_score: float


def _layers(v: VindexReader, layers: tuple[int, int] | list[int] | None) -> list[int]:
    if layers is None:
        return list(range(v.num_layers))
    if isinstance(layers, tuple):
        lo, hi = layers
        if lo > hi:
            raise VindexError(f"layer range {lo}-{hi} is empty (start must be <= end)")
        layers = list(range(lo, hi + 1))
    for layer in layers:
        v.num_features(layer)  # range check with a clear error
    return list(layers)


def _hit(v: VindexReader, layer: int, feature: int, score: float, n_down: int) -> FeatureHit:
    ids, _ = v.down_meta(layer)
    tokens = tuple(clean_token(v.token_text(int(t))) for t in ids[feature][: max(n_down, 1)])
    return FeatureHit(layer, feature, score, tokens[0], tokens[1:n_down + 1] if n_down else ())


def walk(v: VindexReader, prompt: str, top: int = 10, layers: tuple[int, int] | list[int] | None = None,
         n_down: int = 3) -> WalkResult:
    """Gate KNN of the last prompt token's (scaled) embedding at every selected layer: a feature
    scan, not inference (no attention runs)."""
    ids = v.tokenizer.encode(prompt)
    if not ids:
        raise VindexError(f"WALK {prompt!r}: the prompt has no tokens")
    query = v.token_embedding(ids[-1])
    chosen = _layers(v, layers)
    hits = [_hit(v, layer, f, s, n_down) for layer in chosen for f, s in v.gate_knn(layer, query, top)]
    return WalkResult(prompt, v.tokenizer.token_text(ids[-1]), ids[-1], tuple(chosen), tuple(hits))


def nearest(v: VindexReader, entity: str, layer: int, limit: int = 20) -> list[FeatureHit]:
    """SELECT ... FROM EDGES NEAREST TO "entity" AT LAYER n: gate KNN of the entity's mean embedding."""
    query = v.entity_embedding(entity)
    return [_hit(v, layer, f, s, 3) for f, s in v.gate_knn(layer, query, limit)]


def iter_features(v: VindexReader, layers: tuple[int, int] | list[int] | None = None) -> Iterator[FeatureHit]:
    """Every feature's metadata (score = c_score), layer by layer."""
    for layer in _layers(v, layers):
        ids, scores = v.down_meta(layer)
        for f in v.feature_ids(layer):  # an editable view's added features too (not a removed one's hole)
            tokens = tuple(clean_token(v.token_text(int(t))) for t in ids[f][:4])
            yield FeatureHit(layer, f, float(scores[f, 0]), tokens[0], tokens[1:])


def select_features(v: VindexReader, layer: int | None = None, feature: int | None = None, token: str | None = None,
                    limit: int | None = None) -> list[FeatureHit]:
    """SELECT * FROM FEATURES [WHERE layer = .. AND feature = .. AND token = ..]: token is an exact,
    case-insensitive match on the top output token."""
    rows = []
    for hit in iter_features(v, None if layer is None else [layer]):
        if feature is not None and hit.feature != feature:
            continue
        if token is not None and hit.top_token.lower() != token.strip().lower():
            continue
        rows.append(hit)
        if limit is not None and len(rows) >= limit:
            break
    if feature is not None and layer is not None and not rows:
        v.feature_meta(layer, feature)  # raises the out-of-range error
    return rows


def select_edges(v: VindexReader, entity: str | None = None, layer: int | None = None, min_score: float | None = None,
                 order: str = "score", descending: bool = True, limit: int = 20) -> list[FeatureHit]:
    """SELECT ... FROM EDGES (scan mode): features whose top output token contains `entity`
    (case-insensitive), optionally at one layer and above a score, ordered by score or layer."""
    if order not in ("score", "layer"):
        raise VindexError(f"cannot ORDER BY {order!r} on edges (use score or layer)")
    needle = entity.lower() if entity else None
    rows = [h for h in iter_features(v, None if layer is None else [layer])
            if (needle is None or needle in h.top_token.lower()) and (min_score is None or h.score >= min_score)]
    key = (lambda h: h.score) if order == "score" else (lambda h: (h.layer, h.feature))
    rows.sort(key=key, reverse=descending)
    return rows[:limit]


def is_entity_like(token: str) -> bool:
    t = clean_token(token)
    return len(t) >= 3 and t.isascii() and t.isalpha() and t[0].isupper() and t.lower() not in STOP_WORDS


def select_entities(v: VindexReader, layer: int | None = None, limit: int = 50) -> list[EntityCount]:
    """Entity-like top tokens (capitalised, alphabetic, >= 3 letters, not stop words) by how many
    features write them."""
    counts: Counter[str] = Counter()
    best: dict[str, float] = {}
    for hit in iter_features(v, None if layer is None else [layer]):
        if is_entity_like(hit.top_token):
            counts[hit.top_token] += 1
            best[hit.top_token] = max(best.get(hit.top_token, float("-inf")), hit.score)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], -best[kv[0]], kv[0]))
    return [EntityCount(t, n, best[t]) for t, n in ranked[:limit]]
