"""DESCRIBE: an entity's knowledge card, as a value.

Two kinds of edge. *Feature edges* follow LARQL (reference §4.1): the entity's mean token embedding
(scaled) queries every layer's gate vectors; a feature that fires strongly contributes its top
output token as an edge target. On a small model these are mostly category features (countries,
"Japanese", ...), and raw hits are dominated by multilingual and code fragments, so targets must be
readable English-like content tokens. *Probe edges* (when the vindex carries model weights) run
relation templates through the model itself and report what it answers, with the probability of
its first token: they are what the model knows when asked, labelled as such.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import numpy as np

from larql.errors import VindexError
from larql.vindex.layout import DESCRIBE_HITS_PER_LAYER as HITS_PER_LAYER
from larql.vindex.layout import DESCRIBE_MIN_GATE as MIN_GATE
from larql.vindex.layout import describe_layers
from larql.vindex.tokens import Edge, clean_token, is_content_token

if TYPE_CHECKING:
    from larql.model import Model
    from larql.vindex.reader import VindexReader

BANDS = ("syntax", "knowledge", "output")
CAP: dict[str, dict[str, int] | int] = {"brief": {"syntax": 10, "knowledge": 10, "output": 5}, "verbose": 30, "raw": 30}



# A neutral reference point for DESCRIBE's query: the mean embedding of common, unrelated words.
# Querying with (entity - baseline) ranks features by how much more the entity drives them than an
# ordinary word does; "hub" features that fire for every input drop out (a gate score is linear
# in the query, so this is exactly gate(entity) - gate(baseline)).
BASELINE_WORDS = ("the house water dog run blue happy music river city country people John Mary table "
                  "computer money book school garden mountain king war science film game car tree food bird "
                  "ocean letter").split()


# per opened vindex (a store or an editable view), computed once; weak, so closing a vindex frees it
_BASELINES: WeakKeyDictionary[object, np.ndarray] = WeakKeyDictionary()


def baseline_query(v: VindexReader) -> np.ndarray:
    if v not in _BASELINES:
        _BASELINES[v] = np.mean([v.entity_embedding(w) for w in BASELINE_WORDS], axis=0)
    return _BASELINES[v]


@dataclass
class DescribeResult:
    entity: str
    found: bool
    signal: str  # "clean" | "moderate" | "diffuse" | "none"
    max_gate: float
    bands: dict[str, list[Edge]] = field(default_factory=dict)  # feature edges by band of their best layer
    probes: list[Edge] = field(default_factory=list)
    layer_bands: dict[str, list[int]] = field(default_factory=dict)

    @property
    def edges(self) -> list[Edge]:
        return [*self.probes, *(e for band in BANDS for e in self.bands.get(band, []))]


def _band_of(layer: int, bands: dict[str, list[int]]) -> str:
    for name in BANDS:
        lo, hi = bands[name]
        if lo <= layer <= hi:
            return name
    return "knowledge"


def feature_edges(v: VindexReader, entity: str, layers: list[int], relations_only: bool = False,
                  contrastive: bool = True, hits_per_layer: int = HITS_PER_LAYER,
                  min_gate: float = MIN_GATE) -> list[Edge]:
    """Gate-KNN edges of `entity` over `layers`, merged by target (LARQL §4.1 steps 1-4)."""
    query = v.entity_embedding(entity)
    if contrastive:
        query = query - baseline_query(v)
    entity_key = entity.strip().lower()
    merged: dict[str, Edge] = {}
    for layer in layers:
        ids, scores = v.down_meta(layer)
        for feature, gate in v.gate_knn(layer, query, hits_per_layer):
            if gate < min_gate:
                continue
            tokens = [clean_token(v.token_text(int(t))) for t in ids[feature]]
            target = tokens[0]
            if not is_content_token(target) or target.lower() == entity_key:
                continue
            readable = [t for t, s in zip(tokens[1:], scores[feature][1:])
                        if s > 0 and t and t.lower() not in (target.lower(), entity_key)][:5]
            also = tuple(t for t in readable if is_content_token(t))[:3]
            if not also and readable and gate < 20.0:  # LARQL's coherence filter
                continue
            key = target.lower()
            old = merged.get(key)
            if old is None:
                merged[key] = Edge(target, gate, layer, feature, "feature", v.feature_label(layer, feature),
                                   (layer,), 1, also)
            else:
                best = (gate, layer, feature, also) if gate > old.score else (old.score, old.layer, old.feature, old.also)
                merged[key] = Edge(target, best[0], best[1], best[2], "feature", v.feature_label(best[1], best[2]),
                                   tuple(sorted({*old.layers, layer})), old.hits + 1, best[3])
    edges = list(merged.values())
    if relations_only:  # only edges whose feature belongs to a relation cluster
        edges = [e for e in edges if e.label]
    return edges


def describe(v: VindexReader, entity: str, band: str | None = None, at_layer: int | None = None,
             relations_only: bool = False, mode: str = "brief", model: Model | None = None,
             probes: bool = True, contrastive: bool = True,
             progress: Callable[[str, int, int], None] | None = None, layers: list[int] | None = None,
             hits_per_layer: int = HITS_PER_LAYER, min_gate: float = MIN_GATE) -> DescribeResult:
    """DESCRIBE "entity" [band] [AT LAYER n] [RELATIONS ONLY] [BRIEF|VERBOSE|RAW].

    `v` is a store or an editable view (anything with its browsing methods: down_meta, gate_knn,
    entity_embedding, ...). Probe edges run when `probes` is true and a model is given: the model
    the vindex carries (`larql.load(path)`, or an editable view's `model()`) or any other.
    """
    if band is not None and band not in (*BANDS, "all"):
        raise VindexError(f"unknown band {band!r} (choose syntax, knowledge, output or all)")
    if mode not in CAP:
        raise VindexError(f"unknown DESCRIBE mode {mode!r} (choose brief, verbose or raw)")
    bands = v.index["layer_bands"]
    if layers is None:
        layers = describe_layers(v.index["layer_bands"], v.num_layers, band, at_layer)
    for layer in layers:
        v.num_features(layer)  # range check
    try:
        edges = feature_edges(v, entity, layers, relations_only, contrastive, hits_per_layer, min_gate)
    except VindexError:
        return DescribeResult(entity, False, "none", 0.0, layer_bands=bands)
    by_band: dict[str, list[Edge]] = {b: [] for b in BANDS}
    for e in edges:
        by_band[_band_of(e.layer, bands)].append(e)
    caps = CAP[mode]
    for b in BANDS:
        cap = caps[b] if isinstance(caps, dict) else caps
        by_band[b] = sorted(by_band[b], key=lambda e: -e.score)[:cap]
    max_gate = max((e.score for e in edges), default=0.0)
    signal = "clean" if max_gate >= 20 else "moderate" if max_gate >= 10 else "diffuse" if edges else "none"
    result = DescribeResult(entity, True, signal, max_gate, by_band, layer_bands=bands)
    if probes and model is not None:
        from larql.vindex.probes import probe_edges

        result.probes = probe_edges(model, entity, progress=progress)
    return result
