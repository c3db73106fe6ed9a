"""LARQL's vindexes (index.json version 2, written by tests/larql_format.py exactly as
larql-reference.md §3 lays them out) converted into larql vindexes: the converted gates, down_meta
and embeddings equal the source's arrays, DESCRIBE and WALK run on it, and everything that cannot
be converted, or is impossible, is refused in one line naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import larql
from larql.errors import LarqlError, VindexError
from larql.lql.executor import execute
from larql.vindex.larql_import import convert_larql, is_larql_vindex
from larql.vindex.store import open_vindex
from tests.larql_format import write_larql_vindex
from tests.synthetic import TinySpec, tiny_vindex


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("larql-import"), TinySpec("gemma3", n_layers=4, ffn=96), seed=5,
                       level="browse", dtype="f32")


@pytest.fixture(scope="module")
def larqls(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LARQL's form of `base` (f32, down_meta.bin)."""
    return write_larql_vindex(tmp_path_factory.mktemp("larql") / "rust.vindex", open_vindex(base))


def copy_of(src: Path, tmp: Path) -> Path:
    out = tmp / "copy.vindex"
    shutil.copytree(src, out)
    return out


def assert_same_arrays(converted: Path, base: Path, exact: bool = True) -> None:
    v, b = open_vindex(converted), open_vindex(base)
    assert v.verify() == [] and not v.has_model_weights and v.index["extract_level"] == "browse"
    tol = 0 if exact else 1e-3
    np.testing.assert_allclose(np.asarray(v.embeddings, np.float32), np.asarray(b.embeddings, np.float32), atol=tol)
    for layer in range(b.num_layers):
        np.testing.assert_allclose(np.asarray(v.gate_vectors(layer), np.float32),
                                   np.asarray(b.gate_vectors(layer), np.float32), atol=tol)
        ids, scores = v.down_meta(layer)
        np.testing.assert_array_equal(ids, b.down_meta(layer)[0])  # tokens
        np.testing.assert_array_equal(scores, b.down_meta(layer)[1])  # and scores, exactly
    query = b.entity_embedding("hello")
    if exact:
        assert [v.gate_knn(layer, query, 5) for layer in range(4)] == [b.gate_knn(layer, query, 5) for layer in range(4)]
    assert v.feature_meta(2, 7) == b.feature_meta(2, 7)


def test_converts_and_answers_as_the_source(larqls: Path, base: Path, tmp_path: Path) -> None:
    assert is_larql_vindex(larqls) and not is_larql_vindex(base)
    out = convert_larql(larqls, tmp_path / "c.vindex")
    assert_same_arrays(out, base)
    index = json.loads((out / "index.json").read_text())
    assert index["model"] == "google/tiny-test" and index["source"]["path"] == str(larqls.resolve())
    assert index["dtype"] == "f32" and index["down_top_k"] == 10
    # DESCRIBE and WALK run on it, and answer as on the vindex LARQL's was written from
    for text in ('DESCRIBE "hello"', 'WALK "hello world" TOP 3', 'SELECT * FROM EDGES LIMIT 5'):
        got = execute(f'USE "{out}"; {text}')[1]
        want = execute(f'USE "{base}"; {text}')[1]
        assert got.rows == want.rows and (want.rows or text.startswith("DESCRIBE")), text  # tiny: no content words


def test_f16_source_reversed_magic_and_dtype_choice(base: Path, tmp_path: Path) -> None:
    src = write_larql_vindex(tmp_path / "h.vindex", open_vindex(base), dtype="f16", reversed_magic=True)
    out = convert_larql(src, tmp_path / "c.vindex")
    assert json.loads((out / "index.json").read_text())["dtype"] == "f16"
    assert_same_arrays(out, base, exact=False)
    wide = convert_larql(src, tmp_path / "w.vindex", dtype="f32")
    assert open_vindex(wide).index["dtype"] == "f32"


def test_legacy_jsonl_and_labels(base: Path, tmp_path: Path) -> None:
    src = write_larql_vindex(tmp_path / "j.vindex", open_vindex(base), jsonl=True,
                             labels={"L2_F7": "capital", "3:1": "language"})
    out = convert_larql(src, tmp_path / "c.vindex")
    assert_same_arrays(out, base)
    v = open_vindex(out)
    assert v.feature_label(2, 7) == "capital" and v.feature_label(3, 1) == "language"


def test_opening_or_using_a_larql_vindex_names_the_converter(larqls: Path) -> None:
    before = sorted(p.name for p in larqls.iterdir())
    with pytest.raises(VindexError, match=r"a LARQL vindex \(index.json version 2\).*larql convert .*rust.vindex OUT"):
        larql.open_vindex(larqls)
    with pytest.raises(LarqlError, match="larql convert"):
        execute(f'USE "{larqls}"; STATS')
    assert sorted(p.name for p in larqls.iterdir()) == before  # nothing written beside it


def test_weights_are_refused_unless_browse_is_asked_for(larqls: Path, tmp_path: Path) -> None:
    src = copy_of(larqls, tmp_path)
    (src / "attn_weights.bin").write_bytes(b"\0" * 64)
    (src / "weight_manifest.json").write_text("[]")
    with pytest.raises(VindexError, match=r"attn_weights.bin \(and 1 more\): browse level only; the model's weights "
                                          r"are not converted; extract the model with `larql extract` for inference"):
        convert_larql(src, tmp_path / "c.vindex")
    with pytest.raises(VindexError, match="browse level only"):
        convert_larql(src, tmp_path / "c.vindex", level="inference")
    assert not (tmp_path / "c.vindex").exists()
    out = convert_larql(src, tmp_path / "c.vindex", level="browse")
    assert "attn_weights.bin" not in open_vindex(out).index["files"]


def _damage(src: Path, name: str, edit) -> None:  # type: ignore[no-untyped-def]
    data = bytearray((src / name).read_bytes())
    (src / name).write_bytes(bytes(edit(data)))


RECORD = 8 + 8 * 10  # top_token_id, c_score, 10 x (id, logit)


def _set(data: bytearray, offset: int, value: bytes) -> bytearray:
    data[offset:offset + len(value)] = value
    return data


@pytest.mark.parametrize(("name", "edit", "message"), [
    ("down_meta.bin", lambda d: _set(d, 0, b"XXXX"), "down_meta.bin: bad magic 0x58585858"),
    ("down_meta.bin", lambda d: d[:-5], "run past the end of the file"),
    ("down_meta.bin", lambda d: d[:10], "shorter than its 16-byte header"),
    ("down_meta.bin", lambda d: d + b"\0" * 4, "4 bytes after the last layer's records"),
    ("down_meta.bin", lambda d: _set(d, 16, np.array([-3], "<i4").tobytes()), "layer 0 feature count -3 is negative"),
    ("down_meta.bin", lambda d: _set(d, 16, np.array([95], "<u4").tobytes()),
     "layer 0 has 95 records, index.json says 96 features"),
    ("down_meta.bin", lambda d: _set(d, 4, np.array([2], "<u4").tobytes()), "down_meta version 2; LARQL's is 1"),
    ("down_meta.bin", lambda d: _set(d, 12, np.array([0], "<u4").tobytes()), "header top_k is 0"),
    ("down_meta.bin", lambda d: _set(d, 20 + RECORD + 8, np.array([999_999], "<u4").tobytes()),
     r"layer 0 has a token id 999999 outside the vocabulary \(0..256\)"),
    ("down_meta.bin", lambda d: _set(d, 20, np.array([5000], "<u4").tobytes()),
     "layer 0 has a top_token_id 5000 outside the vocabulary"),
    ("down_meta.bin", lambda d: _set(d, 20 + RECORD + 12, np.array([np.nan], "<f4").tobytes()),
     "layer 0's logits holds NaN"),
    ("down_meta.bin", lambda d: _set(d, 24, np.array([np.inf], "<f4").tobytes()), "layer 0's c_score holds NaN or infinite"),
    ("gate_vectors.bin", lambda d: d[:-4], "layer 3's block (.*) runs past the end of the file"),
    ("gate_vectors.bin", lambda d: _set(d, 4 * 64 * 96 + 8, np.array([np.nan], "<f4").tobytes()),
     "gate_vectors.bin: layer 1's gate vectors holds NaN"),
    ("embeddings.bin", lambda d: d[:-4], "embeddings.bin: .* bytes, but vocab_size x hidden_size x f32 is"),
    ("embeddings.bin", lambda d: _set(d, 40, np.array([np.nan], "<f4").tobytes()), "embeddings.bin: rows 0..256 holds NaN"),
])
def test_impossible_files_are_refused(larqls: Path, tmp_path: Path, name: str, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    src = copy_of(larqls, tmp_path)
    _damage(src, name, edit)
    with pytest.raises(VindexError, match=message) as e:
        convert_larql(src, tmp_path / "c.vindex")
    assert len(str(e.value).splitlines()) == 1 and not (tmp_path / "c.vindex").exists()


def _edit_index(src: Path, change) -> None:  # type: ignore[no-untyped-def]
    index = json.loads((src / "index.json").read_text())
    change(index)
    (src / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(("change", "message"), [
    (lambda i: i["layers"][1].update(num_features=-1), r"layers\[1\]: num_features is '-1'"),
    (lambda i: i["layers"][1].update(length=5), r"layers\[1\]: length 5 bytes, but 96 features"),
    (lambda i: i["layers"].pop(), "layers must list 4 entries"),
    (lambda i: i.update(vocab_size=100), "embeddings.bin: 65792 bytes, but vocab_size x hidden_size x f32 is 25600"),
    (lambda i: i.update(dtype="bf16"), "dtype 'bf16'; LARQL writes f32 or f16"),
    (lambda i: i.update(layer_bands={"syntax": [0, 9]}), r"layer_bands.syntax is \[0, 9\]"),
    (lambda i: i.update(version=3), "not LARQL's index.json"),
])
def test_impossible_index_is_refused(larqls: Path, tmp_path: Path, change, message: str) -> None:  # type: ignore[no-untyped-def]
    src = copy_of(larqls, tmp_path)
    _edit_index(src, change)
    with pytest.raises(VindexError, match=message):
        convert_larql(src, tmp_path / "c.vindex")


def test_jsonl_out_of_vocabulary_and_nan_are_refused(base: Path, tmp_path: Path) -> None:
    src = write_larql_vindex(tmp_path / "j.vindex", open_vindex(base), jsonl=True)
    lines = (src / "down_meta.jsonl").read_text().splitlines()
    good = list(lines)
    rec = json.loads(lines[3])
    rec["k"][2]["i"] = 70000
    lines[3] = json.dumps(rec)
    (src / "down_meta.jsonl").write_text("\n".join(lines))
    with pytest.raises(VindexError, match=r"down_meta.jsonl:4: k\[2\]: i is '70000'"):
        convert_larql(src, tmp_path / "c.vindex")
    lines = list(good)
    lines[5] = lines[5].replace('"s": ', '"s": NaN, "x": ', 1)
    (src / "down_meta.jsonl").write_text("\n".join(lines))
    with pytest.raises(VindexError, match="down_meta.jsonl:6: not valid JSON"):
        convert_larql(src, tmp_path / "c.vindex")
    (src / "down_meta.jsonl").write_text("\n".join([*good, good[0]]))
    with pytest.raises(VindexError, match="layer 0 feature 0 again"):
        convert_larql(src, tmp_path / "c.vindex")


def test_unconvertible_files_are_refused_by_name(larqls: Path, tmp_path: Path) -> None:
    src = copy_of(larqls, tmp_path)
    (src / "gate_vectors.bin").rename(src / "gate_vectors_q4.bin")
    with pytest.raises(VindexError, match="gate_vectors_q4.bin: LARQL's quantized gate vectors, and no "
                                          "gate_vectors.bin"):
        convert_larql(src, tmp_path / "c.vindex")
    (src / "gate_vectors_q4.bin").rename(src / "gate_vectors.bin")
    (src / "layers").mkdir()
    (src / "layers" / "layer_00.weights").write_bytes(b"LYRW")
    with pytest.raises(VindexError, match="layers/layer_00.weights: browse level only"):
        convert_larql(src, tmp_path / "c.vindex")
    shutil.rmtree(src / "layers")
    (src / "knn_store.bin").write_bytes(b"LKNN")
    with pytest.raises(VindexError, match="knn_store.bin: LARQL's stored INSERT edits"):
        convert_larql(src, tmp_path / "c.vindex", level="browse")


def test_verify_and_repair_convert_again(larqls: Path, base: Path, tmp_path: Path) -> None:
    from larql.vindex.verify import repair, verify_vindex

    src = copy_of(larqls, tmp_path)
    out = convert_larql(src, tmp_path / "c.vindex")
    report = verify_vindex(out)
    assert report.ok and "converted from the LARQL vindex" in report.source_note
    data = bytearray((out / "gate_vectors.bin").read_bytes())
    data[100] ^= 1
    (out / "gate_vectors.bin").write_bytes(bytes(data))
    with pytest.raises(VindexError, match=f"convert it again: larql convert {src.resolve()} {out} --level browse"):
        open_vindex(out)
    assert verify_vindex(out).bad_files == ["gate_vectors.bin"]
    repair(out)
    assert_same_arrays(out, base)


def test_relation_clusters_come_along_and_are_checked(base: Path, tmp_path: Path) -> None:
    hidden = open_vindex(base).hidden
    clusters = {"k": 2, "centres": [[0.5] * hidden, [-0.5] * hidden], "labels": ["capital", "language"],
                "counts": [2, 1], "top_tokens": [["Paris"], ["French"]]}
    members = "".join(json.dumps(m) + "\n" for m in [{"l": 2, "f": 5, "c": 0}, {"l": 3, "f": 9, "c": 1}])
    src = write_larql_vindex(tmp_path / "r.vindex", open_vindex(base),
                             extra={"relation_clusters.json": json.dumps(clusters).encode(),
                                    "feature_clusters.jsonl": members.encode()})
    v = open_vindex(convert_larql(src, tmp_path / "c.vindex"))
    assert v.feature_label(2, 5) == "capital" and v.feature_label(3, 9) == "language" and v.feature_label(1, 1) is None
    (src / "feature_clusters.jsonl").write_text(members + json.dumps({"l": 1, "f": 2, "c": 7}) + "\n")
    with pytest.raises(VindexError, match=r"feature_clusters.jsonl:3: c is '7'; expected an integer in 0..1"):
        convert_larql(src, tmp_path / "d.vindex")
    (src / "relation_clusters.json").write_text(json.dumps(clusters).replace("0.5", "1e400", 1))  # JSON's infinity
    with pytest.raises(VindexError, match="relation_clusters.json: centres holds NaN or infinite"):
        convert_larql(src, tmp_path / "d.vindex")
    (src / "relation_clusters.json").write_text(json.dumps({**clusters, "centres": [[0.5] * 3] * 2}))
    with pytest.raises(VindexError, match=f"centres must be 2 x {hidden}"):
        convert_larql(src, tmp_path / "d.vindex")


def test_experts_convert_and_mixed_layouts_are_refused(larqls: Path, tmp_path: Path) -> None:
    src = copy_of(larqls, tmp_path)
    _edit_index(src, lambda i: [e.update(num_experts=2, num_features_per_expert=48) for e in i["layers"]])
    v = open_vindex(convert_larql(src, tmp_path / "c.vindex"))
    assert v.index["intermediate_size"] == 48 and v.index["model_config"]["n_experts"] == 2
    assert v.num_experts(1) == 2 and v.feature_name(1, 50) == "L1 E1 F2"
    _edit_index(src, lambda i: [e.pop("num_experts") for e in i["layers"][1:]])
    with pytest.raises(VindexError, match=r"different numbers of experts or features \(1 x 96, 2 x 48\)"):
        convert_larql(src, tmp_path / "d.vindex")
    _edit_index(src, lambda i: [e.update(num_experts=4 if e["layer"] == 0 else 2,
                                         num_features_per_expert=24 if e["layer"] == 0 else 48) for e in i["layers"]])
    with pytest.raises(VindexError, match=r"layers with different numbers of experts or features \(2 x 48, 4 x 24\)"):
        convert_larql(src, tmp_path / "d.vindex")


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(larqls: Path, tmp_path: Path) -> None:
    src = copy_of(larqls, tmp_path)
    tok = json.loads((src / "tokenizer.json").read_text())
    tok["added_tokens"].append({"id": 257, "content": "<extra>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    (src / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(VindexError, match="tokenizer.json: 258 tokens, more than vocab_size 257"):
        convert_larql(src, tmp_path / "c.vindex")
    (src / "tokenizer.json").write_text("{not json")
    with pytest.raises(VindexError, match="tokenizer.json: not a tokenizers JSON"):
        convert_larql(src, tmp_path / "c.vindex")
