"""Damaged vindexes and bad requests give a VindexError naming the file and the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from larql.errors import VindexError
from larql.vindex.extract import extract
from larql.vindex.store import open_vindex
from tests.synthetic import TinySpec, hf_weights, write_gguf


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("badvx")
    spec = TinySpec("llama")
    write_gguf(root / "m.gguf", spec, hf_weights(spec), gguf.GGMLQuantizationType.Q8_0)
    return extract(root / "m.gguf", root / "good.vindex", level="inference")


@pytest.fixture
def copy(good: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(good, tmp_path / "c.vindex"))


def edit_index(path: Path, fn) -> None:  # type: ignore[no-untyped-def]
    index = json.loads((path / "index.json").read_text())
    fn(index)
    (path / "index.json").write_text(json.dumps(index))


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(VindexError, match="no such vindex directory"):
        open_vindex(tmp_path / "none.vindex")


def test_not_a_vindex(tmp_path: Path) -> None:
    with pytest.raises(VindexError, match=r"not a vindex \(no index.json\)"):
        open_vindex(tmp_path)


def test_index_not_json(copy: Path) -> None:
    (copy / "index.json").write_text("{not json")
    with pytest.raises(VindexError, match="index.json: not valid JSON"):
        open_vindex(copy)


@pytest.mark.parametrize("mutate, message", [
    (lambda i: i.pop("num_layers"), "fails its schema at \\(top level\\): 'num_layers' is a required property"),
    (lambda i: i.update(dtype="f8"), "fails its schema at dtype: 'f8' is not one of"),
    (lambda i: i.update(version=7), "fails its schema at version: 1 was expected"),
    (lambda i: i["layers"][0].update(gate_offset=3), "fails its schema at layers/0/gate_offset: 3 is not a multiple of 64"),
])
def test_schema_failures(copy: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    edit_index(copy, mutate)
    with pytest.raises(VindexError, match=message):
        open_vindex(copy)


def test_missing_file(copy: Path) -> None:
    (copy / "gate_vectors.bin").unlink()
    with pytest.raises(VindexError, match="gate_vectors.bin: missing file listed in index.json"):
        open_vindex(copy)


def test_truncated_file(copy: Path) -> None:
    data = (copy / "down_meta.bin").read_bytes()
    (copy / "down_meta.bin").write_bytes(data[:-10])
    with pytest.raises(VindexError, match=r"down_meta.bin: size \d+ bytes, index.json says \d+ \(truncated or replaced\)"):
        open_vindex(copy)


def test_wrong_magic(copy: Path) -> None:
    data = bytearray((copy / "down_meta.bin").read_bytes())
    data[:4] = b"DMET"
    (copy / "down_meta.bin").write_bytes(bytes(data))
    with pytest.raises(VindexError, match="down_meta.bin: contents differ from the sha256 in index.json"):
        open_vindex(copy)


def test_bit_flip_is_found_on_open(copy: Path) -> None:
    data = bytearray((copy / "embeddings.bin").read_bytes())
    data[100] ^= 0x10
    (copy / "embeddings.bin").write_bytes(bytes(data))
    with pytest.raises(VindexError, match=r"embeddings.bin: contents differ .*; re-extract it: larql extract "
                                          r"\S+m.gguf -o \S+c.vindex --level inference --force$"):
        open_vindex(copy)  # sizes still match: only the hash can tell


def test_inconsistent_layer_table(copy: Path) -> None:
    edit_index(copy, lambda i: i["layers"][1].update(num_features=7))
    with pytest.raises(VindexError, match="layer 1 has 7 features, intermediate_size is 128"):
        open_vindex(copy)
    edit_index(copy, lambda i: i["layers"][1].update(num_features=128, gate_length=64))
    with pytest.raises(VindexError, match="layer 1 gate_length does not match num_features x hidden"):
        open_vindex(copy)


def test_out_of_range_requests(good: Path) -> None:
    v = open_vindex(good)
    with pytest.raises(VindexError, match=r"layer 9 out of range 0\.\.1"):
        v.gate_vectors(9)
    with pytest.raises(VindexError, match=r"feature 128 out of range 0\.\.127 at layer 0"):
        v.feature_meta(0, 128)
    with pytest.raises(VindexError, match="query has 3 values; this vindex's hidden size is 64"):
        v.gate_knn(0, np.zeros(3, np.float32))
    with pytest.raises(VindexError, match="token id -1 out of range"):
        v.token_embedding(-1)


def test_bad_extract_arguments(good: Path, tmp_path: Path) -> None:
    src = good.parent / "m.gguf"
    with pytest.raises(VindexError, match="unknown extract level 'full'"):
        extract(src, tmp_path / "a.vindex", level="full")
    with pytest.raises(VindexError, match="unknown dtype 'bf16'"):
        extract(src, tmp_path / "a.vindex", dtype="bf16")
    assert not (tmp_path / "a.vindex").exists()
