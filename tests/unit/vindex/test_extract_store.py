"""Extraction and the read-only store on tiny seeded models: layout, exactness, KNN, atomicity."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import jsonschema
import numpy as np
import pytest

import larql
from larql.errors import VindexError
from larql.quant.quantize import quantize_q4_k, quantize_q6_k
from larql.vindex import layout
from larql.vindex.extract import extract
from larql.vindex.store import open_vindex
from tests.conftest import rel_err
from tests.synthetic import TinySpec, hf_weights, reference_logits, write_gguf, write_hf_dir

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "vindex_spec" / "index.schema.json").read_text())


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("vx")
    spec = TinySpec("gemma3", n_layers=3, ffn=96)
    w = hf_weights(spec, seed=11)
    write_gguf(root / "m.gguf", spec, w, gguf.GGMLQuantizationType.Q8_0)
    write_hf_dir(root / "hf", spec, w)
    return {"root": root, "gguf": root / "m.gguf", "hf": root / "hf"}


@pytest.fixture(scope="module")
def tiny_vindex(tiny_src: dict) -> Path:
    return extract(tiny_src["gguf"], tiny_src["root"] / "m.vindex", level="inference", dtype="f32", top_k=5)


def test_index_validates_against_schema(tiny_vindex: Path) -> None:
    index = json.loads((tiny_vindex / "index.json").read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(index)
    assert index["extract_level"] == "inference" and index["has_model_weights"] is True
    optional = {layout.CLUSTERS_FILE, layout.FEATURE_CLUSTERS_FILE}
    assert {*layout.BROWSE_FILES, *layout.INFERENCE_FILES} <= set(index["files"]) <= {
        *layout.BROWSE_FILES, *layout.INFERENCE_FILES, *optional}


def test_layout_constants_match_format_md() -> None:
    spec = (ROOT / "vindex_spec" / "FORMAT.md").read_text()
    assert f"multiple of **{layout.ALIGNMENT}**" in spec
    assert f"magic `{layout.DOWN_META_MAGIC.decode()}`" in spec
    assert f"format version, `{layout.DOWN_META_VERSION}`" in spec
    assert f"A {layout.DOWN_META_HEADER}-byte header" in spec
    for name in (*layout.BROWSE_FILES, *layout.INFERENCE_FILES, layout.INDEX_FILE, layout.CLUSTERS_FILE,
                 layout.FEATURE_CLUSTERS_FILE):
        assert f"`{name}`" in spec, name
    assert re.search(rf"`version` = `{layout.FORMAT_VERSION}`", spec)


def test_blocks_are_aligned_and_gate_vectors_exact(tiny_vindex: Path, tiny_src: dict) -> None:
    v = open_vindex(tiny_vindex)
    m = larql.load(tiny_src["gguf"])
    for layer in range(v.num_layers):
        e = v.index["layers"][layer]
        assert e["gate_offset"] % 64 == 0 and e["down_meta_offset"] % 64 == 0
        assert np.array_equal(v.gate_vectors(layer), m.weights.layers[layer].gate.dequantize())
    assert np.array_equal(v.embeddings, m.weights.token_embd.dequantize())


def test_down_meta_is_exact_top_k(tiny_vindex: Path, tiny_src: dict) -> None:
    v = open_vindex(tiny_vindex)
    m = larql.load(tiny_src["gguf"])
    unembed = m.weights.output.dequantize().astype(np.float64)
    for layer in range(v.num_layers):
        scores = unembed @ m.weights.layers[layer].down.dequantize().astype(np.float64)  # (vocab, ffn)
        ids, vals = v.down_meta(layer)
        for f in range(0, v.num_features(layer), 7):
            expected = np.argsort(-scores[:, f], kind="stable")[:5]
            assert list(ids[f]) == list(expected), (layer, f)
            assert np.allclose(vals[f], scores[expected, f], rtol=1e-5, atol=1e-6)
        meta = v.feature_meta(layer, 3)
        assert meta.token_ids == tuple(int(i) for i in ids[3]) and meta.c_score == pytest.approx(float(vals[3, 0]))
        assert meta.top_token == m.tokenizer.token_text(int(ids[3, 0]))


def test_gate_knn_matches_brute_force_by_magnitude(tiny_vindex: Path) -> None:
    v = open_vindex(tiny_vindex)
    rng = np.random.default_rng(0)
    for layer in range(v.num_layers):
        q = rng.standard_normal(v.hidden).astype(np.float32)
        scores = v.gate_vectors(layer).astype(np.float64) @ q
        expected = np.argsort(-np.abs(scores), kind="stable")[:8]
        got = v.gate_knn(layer, q, k=8)
        assert [f for f, _ in got] == list(expected)
        assert np.allclose([s for _, s in got], scores[expected], rtol=1e-5)
        assert any(s < 0 for _, s in got) or all(scores[expected] > 0)  # signs kept
    assert len(v.gate_knn(0, q, k=500)) == v.num_features(0)


def test_vindex_runs_the_model_like_the_gguf(tiny_vindex: Path, tiny_src: dict) -> None:
    ids = [5, 80, 81, 120, 7, 7, 9]
    from_vindex, from_gguf = larql.load(tiny_vindex), larql.load(tiny_src["gguf"])
    assert np.array_equal(from_vindex.forward(ids), from_gguf.forward(ids))
    assert from_vindex.tokenize("hello") == from_gguf.tokenize("hello")


def test_browse_level_from_hf_dir(tiny_src: dict, tmp_path: Path) -> None:
    path = extract(tiny_src["hf"], tmp_path / "b.vindex", level="browse", dtype="f16")
    v = open_vindex(path)
    assert v.index["quant"] == "none" and not v.has_model_weights and v.gate_vectors(0).dtype == np.float16
    assert not (path / layout.WEIGHTS_FILE).exists()
    with pytest.raises(VindexError, match="browse-level vindex has no model weights; re-extract with --level inference"):
        larql.load(path)


def test_extraction_is_atomic(tiny_src: dict, tmp_path: Path) -> None:
    target = tmp_path / "x.vindex"

    def boom(stage: str, done: int, total: int) -> None:
        if stage == "gate vectors + down_meta" and done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(tiny_src["gguf"], target, progress=boom)
    assert list(tmp_path.iterdir()) == []  # no target, no temporary directory
    extract(tiny_src["gguf"], target)
    with pytest.raises(VindexError, match="already exists; choose another path or pass --force"):
        extract(tiny_src["gguf"], target)
    extract(tiny_src["gguf"], target, overwrite=True, top_k=3)
    assert open_vindex(target).top_k == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.vindex"]


def test_read_only_use_changes_nothing(tiny_vindex: Path) -> None:
    before = {p.name: p.read_bytes() for p in tiny_vindex.iterdir()}
    v = open_vindex(tiny_vindex)
    v.gate_knn(1, v.entity_embedding("abc"), 4)
    v.feature_meta(2, 0)
    larql.load(tiny_vindex).generate([1, 2, 3], max_new_tokens=2)
    assert v.verify() == []
    with pytest.raises(ValueError):
        v.gate_vectors(0)[0, 0] = 1.0  # the maps are read-only
    assert {p.name: p.read_bytes() for p in tiny_vindex.iterdir()} == before


def test_q4k_extraction_from_safetensors(tmp_path: Path) -> None:
    spec = TinySpec("llama", hidden=256, ffn=512, n_heads=4, n_kv_heads=2, head_dim=64)
    weights = hf_weights(spec, seed=5)
    hf = write_hf_dir(tmp_path / "hf", spec, weights)
    path = extract(hf, tmp_path / "q.vindex", level="inference", quant="q4k")
    manifest = {e["name"]: e["type"] for e in json.loads((path / "weights.json").read_text())}
    assert manifest["blk.0.attn_q.weight"] == "Q4_K" and manifest["blk.1.ffn_gate.weight"] == "Q4_K"
    assert manifest["blk.0.attn_v.weight"] == "Q6_K" and manifest["blk.1.ffn_down.weight"] == "Q6_K"
    assert manifest["token_embd.weight"] == "F32" and manifest["blk.0.attn_norm.weight"] == "F32"
    assert open_vindex(path).index["quant"] == "q4k"
    # the vindex holds exactly the quantized weights: a float64 reference over their round trip agrees
    held = dict(weights)
    for name, w in weights.items():
        if name.endswith(("q_proj.weight", "k_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight")):
            held[name] = quantize_q4_k(w).dequantize()
        elif name.endswith(("v_proj.weight", "down_proj.weight")):
            held[name] = quantize_q6_k(w).dequantize()
    ids = [5, 80, 81, 120, 7, 7, 9]
    quantized = larql.load(path).forward(ids)
    assert rel_err(quantized, reference_logits(spec, held, ids)) <= 1e-5
    assert 0 < rel_err(quantized, larql.load(hf).forward(ids)) < 0.25  # and 4-bit costs something


def test_q4k_requantizes_a_wider_quantized_gguf_and_refuses_a_no_op(tmp_path: Path) -> None:
    spec = TinySpec("llama", hidden=256, ffn=512, n_heads=4, n_kv_heads=2, head_dim=64)
    weights = hf_weights(spec, seed=6)
    write_gguf(tmp_path / "q8.gguf", spec, weights, gguf.GGMLQuantizationType.Q8_0)
    path = extract(tmp_path / "q8.gguf", tmp_path / "q.vindex", level="inference", quant="q4k")
    manifest = {e["name"]: e["type"] for e in json.loads((path / "weights.json").read_text())}
    assert manifest["blk.0.attn_q.weight"] == "Q4_K" and manifest["blk.1.ffn_down.weight"] == "Q6_K"
    assert manifest["token_embd.weight"] == "Q8_0"  # embeddings keep their encoding
    index = open_vindex(path).index
    assert index["quant"] == "q4k" and index["requantized"] == {"Q4_K": 10, "Q6_K": 4, "kept": 1}
    source = extract(tmp_path / "q8.gguf", tmp_path / "s.vindex", level="inference")
    assert (path / "weights.bin").read_bytes() != (source / "weights.bin").read_bytes()
    ids = [5, 80, 81, 120, 7, 7, 9]
    assert 0 < rel_err(larql.load(path).forward(ids), larql.load(tmp_path / "q8.gguf").forward(ids)) < 0.25
    # every matrix Q4_0 (4.5 bits per weight, at or below both targets): nothing to do, so refuse
    write_gguf(tmp_path / "q4.gguf", spec, weights, gguf.GGMLQuantizationType.Q4_0)
    with pytest.raises(VindexError, match="--quant q4k would change nothing in q4.gguf"):
        extract(tmp_path / "q4.gguf", tmp_path / "n.vindex", level="inference", quant="q4k")
    with pytest.raises(VindexError, match="a browse-level vindex holds none"):
        extract(tmp_path / "q8.gguf", tmp_path / "n.vindex", quant="q4k")
    assert not (tmp_path / "n.vindex").exists()
