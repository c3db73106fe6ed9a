"""larql slice: presets and part lists on a tiny inference vindex. Each slice opens, verifies and
answers; only a slice with attention and ffn runs the model, and it runs it exactly as the base."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import larql
from larql.errors import VindexError
from larql.vindex.slice import PRESETS, parse_parts, plan_slice, slice_vindex
from larql.vindex.store import open_vindex
from tests.synthetic import TinySpec, tiny_vindex

IDS = [5, 80, 81, 120, 7, 7, 9]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("slice"), TinySpec("gemma3", n_layers=4, ffn=96), seed=4)


def _tensors(path: Path) -> set[str]:
    return {e["name"] for e in json.loads((path / "weights.json").read_text())}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_each_preset_opens_verifies_and_browses(base: Path, tmp_path: Path, preset: str) -> None:
    out = slice_vindex(base, tmp_path / "s.vindex", preset=preset)
    v = open_vindex(out)
    assert v.verify() == [] and v.index["parts"] == list(PRESETS[preset])
    assert v.index["sliced_from"] == {"path": str(base.resolve()), "preset": preset}
    b = open_vindex(base)
    query = b.entity_embedding("hello")
    assert v.gate_knn(2, query, 3) == b.gate_knn(2, query, 3)  # browsing answers as the base does
    assert v.feature_meta(1, 5) == b.feature_meta(1, 5)
    files = set(v.index["files"])
    assert {"tokenizer.json", "embeddings.bin", "gate_vectors.bin", "down_meta.bin"} <= files
    assert v.has_model_weights == (preset == "inference")
    if preset == "browse":
        assert "weights.bin" not in files and v.index["quant"] == "none"
    elif preset == "client":
        names = _tensors(out)
        assert "blk.0.attn_q.weight" in names and "blk.0.ffn_norm.weight" in names
        assert not any(".ffn_up." in n or ".ffn_down." in n or ".ffn_gate." in n for n in names)
    elif preset == "server":
        assert _tensors(out) == {f"blk.{i}.{k}.weight" for i in range(4) for k in ("ffn_gate", "ffn_up", "ffn_down")}
    # whole files are the base's bytes (hard links where the file system allows)
    assert (out / "gate_vectors.bin").read_bytes() == (base / "gate_vectors.bin").read_bytes()


def test_inference_slice_runs_the_model_as_the_base(base: Path, tmp_path: Path) -> None:
    out = slice_vindex(base, tmp_path / "i.vindex", parts="tokenizer,embeddings,gates,down_meta,attention,ffn")
    np.testing.assert_array_equal(larql.load(out).dense().forward(IDS), larql.load(base).dense().forward(IDS))
    client = slice_vindex(base, tmp_path / "c.vindex", preset="client")
    with pytest.raises(VindexError, match=r"a client slice holds attention but no FFN weights.*run the vindex it "
                                          r"was sliced from \(.*\) with --ffn URL"):
        larql.load(client).forward(IDS)  # not "re-extract": the user needs the source and a server
    with pytest.raises(VindexError, match="browse-level vindex has no model weights; re-extract"):
        larql.load(slice_vindex(base, tmp_path / "b.vindex", preset="browse")).forward(IDS)


def test_sizes_and_bad_requests(base: Path, tmp_path: Path) -> None:
    v = open_vindex(base)
    sizes = {p.name: p.size for p in plan_slice(v, PRESETS["inference"])}
    assert sizes["gates"] == v.index["files"]["gate_vectors.bin"]["size"]
    assert 0 < sizes["ffn"] and 0 < sizes["attention"]
    assert sizes["ffn"] + sizes["attention"] >= v.index["files"]["weights.bin"]["size"] - 64
    with pytest.raises(VindexError, match="unknown preset 'tiny'"):
        parse_parts("tiny", None)
    with pytest.raises(VindexError, match="unknown part 'ffm'"):
        parse_parts(None, "tokenizer,embeddings,gates,down_meta,ffm")
    with pytest.raises(VindexError, match="--parts must include gates, down_meta"):
        parse_parts(None, "tokenizer,embeddings,ffn")
    browse = slice_vindex(base, tmp_path / "b.vindex", preset="browse")
    with pytest.raises(VindexError, match="has no ffn tensors"):
        slice_vindex(browse, tmp_path / "x.vindex", preset="server")
    with pytest.raises(VindexError, match="already exists"):
        slice_vindex(base, browse, preset="browse")
    with pytest.raises(VindexError, match="is the vindex being sliced .*, which is read-only"):
        slice_vindex(base, base, preset="browse", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.vindex"]  # failures leave nothing behind
