"""DESCRIBE, WALK, NEAREST and SELECT on the real Gemma 3 270M vindex, against the fact table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import larql
from larql.errors import VindexError
from larql.vindex import browse, open_vindex
from larql.vindex.describe import describe
from larql.vindex.tokens import is_content_token

FACTS = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "facts_gemma3_270m.json").read_text())["facts"]


def test_fact_table_is_true_of_the_model(gemma: larql.Model) -> None:
    assert len(FACTS) >= 30
    for fact in FACTS:
        text = gemma.generate(fact["check_prompt"], max_new_tokens=6).text.lower()
        assert fact["target"].lower() in text, (fact, text)


def test_describe_surfaces_known_facts_as_probe_edges(gemma_vindex: Path) -> None:
    v = open_vindex(gemma_vindex)
    model = larql.load(gemma_vindex)  # probe edges ask the model the vindex carries
    sample = FACTS[::4]  # 11 facts across every relation
    hits = 0
    for fact in sample:
        card = describe(v, fact["entity"], model=model)
        hits += any(e.source == "probe" and e.label == fact["relation"] and e.target.lower().startswith(fact["target"].lower())
                    for e in card.edges)
    assert hits >= 8, f"{hits}/{len(sample)}"  # at MIN_PROB 0.7 (bench_probe_threshold.py: 76% of all facts)
    for made_up in ("Vrellandia", "Quelmaria", "Thalia Brennuck"):  # names the model cannot know: no probe edge
        assert describe(v, made_up, model=model).probes == [], made_up
    france = describe(v, "France", model=model)
    capital = [e for e in france.probes if e.label == "capital"]
    assert capital and capital[0].target == "Paris" and capital[0].score > 0.5
    assert all(0 < e.score <= 1 for e in france.probes)


def test_feature_edges_are_filtered_and_banded(gemma_vindex: Path) -> None:
    v = open_vindex(gemma_vindex)
    card = describe(v, "Japan", probes=False)
    assert card.found and card.probes == []
    targets = {e.target for e in card.edges}
    assert "Japanese" in targets
    assert all(is_content_token(e.target) and e.score >= 5.0 for e in card.edges)
    assert card.signal == ("clean" if card.max_gate >= 20 else "moderate" if card.max_gate >= 10 else "diffuse")
    lo, hi = card.layer_bands["output"]
    assert all(lo <= e.layer <= hi for e in card.bands["output"])
    brief, verbose = describe(v, "Japan", probes=False), describe(v, "Japan", probes=False, mode="verbose")
    assert len(brief.bands["output"]) <= 5 and len(verbose.edges) >= len(brief.edges)
    at = describe(v, "Japan", probes=False, at_layer=17)
    assert {e.layer for e in at.edges} <= {17}
    with pytest.raises(VindexError, match="layer 40 out of range"):
        describe(v, "Japan", at_layer=40)
    with pytest.raises(VindexError, match="unknown DESCRIBE mode 'loud'"):
        describe(v, "Japan", mode="loud")


def test_walk_is_gate_knn_of_the_last_token(gemma_vindex: Path) -> None:
    v = open_vindex(gemma_vindex)
    w = browse.walk(v, "The capital of France is", top=4, layers=(14, 17))
    assert w.token == " is" and w.layers == (14, 15, 16, 17) and len(w.hits) == 16
    query = v.token_embedding(w.token_id).astype(np.float64)
    for layer, hits in w.by_layer().items():
        scores = v.gate_vectors(layer).astype(np.float64) @ query
        assert [h.feature for h in hits] == list(np.argsort(-np.abs(scores), kind="stable")[:4])
        assert hits[0].top_token == v.feature_meta(layer, hits[0].feature).tokens[0].strip()
    with pytest.raises(VindexError, match="layer range 5-2 is empty"):
        browse.walk(v, "x", layers=(5, 2))


def test_nearest_and_selects(gemma_vindex: Path) -> None:
    v = open_vindex(gemma_vindex)
    near = browse.nearest(v, "France", layer=13, limit=5)
    assert [(h.feature, h.score) for h in near] == v.gate_knn(13, v.entity_embedding("France"), 5)
    edges = browse.select_edges(v, entity="Japan", limit=10)
    assert edges and all("japan" in h.top_token.lower() for h in edges)
    assert [h.score for h in edges] == sorted((h.score for h in edges), reverse=True)
    best = edges[0]
    feats = browse.select_features(v, layer=best.layer, token=best.top_token.upper())  # case-insensitive, exact
    assert best.feature in [h.feature for h in feats]
    assert all(h.top_token.lower() == best.top_token.lower() and h.layer == best.layer for h in feats)
    ents = browse.select_entities(v, limit=10)
    assert len(ents) == 10 and [e.count for e in ents] == sorted((e.count for e in ents), reverse=True)
    assert all(browse.is_entity_like(e.token) for e in ents)
