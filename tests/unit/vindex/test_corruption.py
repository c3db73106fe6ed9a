"""A damaged or tampered vindex never answers: every file with flipped bytes, every hand-edited
index.json field and a reshuffled weights.json give one VindexError line naming the file and the
fix, from open_vindex, larql.load and USE alike. Hashes are cached per file stat, so a re-open
reads nothing, and a file changed after it was cached is still caught."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import larql
from larql.errors import LarqlError, LqlSemanticError, VindexError
from larql.lql.executor import execute
from larql.lql.session import Session
from larql.vindex import integrity
from larql.vindex.store import open_vindex
from tests.synthetic import TinySpec, tiny_vindex


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with an empty hash cache of its own."""
    monkeypatch.setenv("LARQL_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("corrupt"), TinySpec("gemma3", n_layers=3, ffn=96), seed=5)


@pytest.fixture
def copy(good: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(good, tmp_path / "c.vindex"))


def refused(path: Path) -> str:
    """The one-line error every way of opening `path` gives (and that they agree)."""
    with pytest.raises(VindexError) as opened:
        open_vindex(path)
    with pytest.raises(VindexError) as loaded:
        larql.load(path)
    with pytest.raises(LqlSemanticError) as used:
        execute(f'USE "{path}"', Session())
    message = str(opened.value)
    assert "\n" not in message and str(loaded.value) == message and message in str(used.value)
    return message


def edit_index(path: Path, change: Callable[[dict[str, Any]], object]) -> None:
    index = json.loads((path / "index.json").read_text())
    change(index)
    (path / "index.json").write_text(json.dumps(index, indent=1))


FILES = ["down_meta.bin", "embeddings.bin", "gate_vectors.bin", "tokenizer.json", "weights.bin", "weights.json"]


def test_the_fixture_has_every_file(good: Path) -> None:
    listed = set(json.loads((good / "index.json").read_text())["files"])
    assert set(FILES) <= listed and open_vindex(good).verify() == []


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("where", [0, 0.5, -1])
def test_a_flipped_byte_in_any_file_is_refused(good: Path, copy: Path, name: str, where: float) -> None:
    data = bytearray((copy / name).read_bytes())
    at = int(where * len(data)) if where >= 0 else len(data) - 1
    data[at] ^= 0x01
    (copy / name).write_bytes(bytes(data))
    message = refused(copy)
    assert message.startswith(f"{copy / name}: contents differ from the sha256 in index.json")
    assert message.endswith(f"; re-extract it: larql extract {good.parent / 'm.gguf'} -o {copy} --level inference --force")


@pytest.mark.parametrize("change, expected", [
    # fields no other check can see: only the seal catches them
    (lambda i: i["model_config"].update(rope_base=12345.0), "its fields were changed after it was written"),
    (lambda i: (i.update(embed_scale=3.0), i["model_config"].update(embed_scale=3.0)),
     "its fields were changed after it was written"),
    (lambda i: i["tokenizer"].update(eos_ids=[1]), "its fields were changed after it was written"),
    (lambda i: i["layer_bands"].update(syntax=[0, 1]), "its fields were changed after it was written"),
    # fields that disagree with others or with the files: named precisely
    (lambda i: i.update(embed_scale=3.0), "embed_scale is 3.0 but model_config.embed_scale is 8.0"),
    (lambda i: i["layers"][1].update(num_features=64, gate_length=64 * 64 * 4, down_meta_length=64 * 80),
     "layer 1 has 64 features, intermediate_size is 96"),
    (lambda i: i["layers"][2].update(gate_offset=0), "layer 2 gate_offset 0 overlaps the block before it"),
    (lambda i: i["layers"][0].update(down_meta_offset=i["layers"][1]["down_meta_offset"]),
     "layer 1 down_meta_offset \\d+ overlaps the block before it"),
    (lambda i: i.update(vocab_size=100), "embeddings.bin: \\d+ bytes listed, but vocab_size x hidden_size x f32"),
    (lambda i: i["model_config"].update(global_layers=[True]), "global_layers must have one entry per layer \\(3\\)"),
    (lambda i: i["tokenizer"].update(bos_id=1 << 40), "tokenizer special id 1099511627776 is outside the vocabulary"),
    (lambda i: i["layer_bands"].update(output=[2, 9]), "layer band output \\[2, 9\\] is outside layers 0..2"),
    (lambda i: i["files"]["embeddings.bin"].update(sha256="0" * 64), "its fields were changed after it was written"),
    (lambda i: i["files"].update({"../m.gguf": {"size": 1, "sha256": "0" * 64}}), "is not a plain name"),
])
def test_a_tampered_index_is_refused(copy: Path, change: Callable[[dict[str, Any]], object], expected: str) -> None:
    edit_index(copy, change)
    message = refused(copy)
    assert message.startswith(str(copy)) and len(message) < 400
    assert re.search(expected, message), message


def test_a_reformatted_index_keeps_its_seal(copy: Path) -> None:
    edit_index(copy, lambda i: None)  # same fields, indent 1 rewritten, key order kept
    index = json.loads((copy / "index.json").read_text())
    (copy / "index.json").write_text(json.dumps(dict(reversed(list(index.items())))))
    assert open_vindex(copy).num_layers == 3


def test_swapped_weight_offsets_are_refused(copy: Path) -> None:
    manifest = json.loads((copy / "weights.json").read_text())
    a, b = next((x, y) for x in manifest for y in manifest if x is not y and x["nbytes"] == y["nbytes"])
    a["offset"], b["offset"] = b["offset"], a["offset"]
    text = json.dumps(manifest, indent=0)
    listed = json.loads((copy / "index.json").read_text())["files"]["weights.json"]["size"]
    (copy / "weights.json").write_text(text.ljust(listed) if len(text) <= listed else text)
    assert "weights.json: " in refused(copy)


@pytest.mark.parametrize("text, expected", [
    ("[" * 100_000 + "]" * 100_000, "nested 100000 deep, more than a vindex index can be"),
    ('{"num_layers": NaN}', "not valid JSON, so not a vindex index file \\(NaN is not a JSON number"),
    ("\xff\xfe", "not valid JSON|not UTF-8"),
    ('"\\' * 50_000, "not valid JSON"),  # an unterminated string must not make the depth scan quadratic
])
def test_a_hostile_index_json_is_refused(copy: Path, text: str, expected: str) -> None:
    (copy / "index.json").write_text(text, encoding="latin-1")
    assert re.search(expected, refused(copy))


def test_a_device_as_index_json_is_refused(copy: Path) -> None:
    (copy / "index.json").unlink()
    (copy / "index.json").symlink_to("/dev/zero")
    with pytest.raises(VindexError, match=r"c.vindex: not a vindex \(no index.json\)$"):
        open_vindex(copy)


def test_an_unsealed_vindex_opens_with_one_warning_and_still_checks_files(
        copy: Path, caplog: pytest.LogCaptureFixture) -> None:
    edit_index(copy, lambda i: i.pop(integrity.SEAL_KEY))
    with caplog.at_level(logging.WARNING, logger="larql.vindex"):
        open_vindex(copy)
        open_vindex(copy)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "no index_sha256 seal (written by an older larql)" in warnings[0]
    data = bytearray((copy / "gate_vectors.bin").read_bytes())
    data[7] ^= 4
    (copy / "gate_vectors.bin").write_bytes(bytes(data))
    assert "gate_vectors.bin: contents differ" in refused(copy)


def test_reopen_reads_nothing_and_a_later_change_is_still_caught(copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hashed: list[str] = []
    real = integrity.file_sha256
    monkeypatch.setattr(integrity, "file_sha256", lambda p: hashed.append(p.name) or real(p))
    open_vindex(copy)
    assert sorted(hashed) == sorted(json.loads((copy / "index.json").read_text())["files"])
    hashed.clear()
    open_vindex(copy)
    assert hashed == []  # every file's stat matched the cache
    f = copy / "embeddings.bin"
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[3] ^= 1
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: only ctime and the hash differ
    with pytest.raises(VindexError, match="embeddings.bin: contents differ"):
        open_vindex(copy)
    assert hashed == ["embeddings.bin"]


def test_a_fresh_extract_is_cached_by_its_writer(good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from larql.vindex.extract import extract

    out = extract(good.parent / "m.gguf", tmp_path / "fresh.vindex", level="browse")
    monkeypatch.setattr(integrity, "file_sha256", lambda p: pytest.fail(f"{p.name} hashed again"))
    assert open_vindex(out).vocab_size == 257


def test_an_unwritable_cache_only_costs_time(copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("LARQL_CACHE", str(blocker))
    assert open_vindex(copy).num_layers == 3 and open_vindex(copy).num_layers == 3


def test_an_intact_copy_answers_like_the_original(good: Path, copy: Path) -> None:
    a, b = open_vindex(good), open_vindex(copy)
    q = a.entity_embedding("ab")
    assert a.gate_knn(1, q, 5) == b.gate_knn(1, q, 5)
    assert np.array_equal(a.down_meta(2)[0], b.down_meta(2)[0])
    data = bytearray((copy / "down_meta.bin").read_bytes())
    data[-1] ^= 1  # the control: one flipped byte, and the copy no longer answers
    (copy / "down_meta.bin").write_bytes(bytes(data))
    with pytest.raises(LarqlError):
        open_vindex(copy)
