"""LARQL's own `.vlp` files, as LARQL writes them (crates/larql-vindex/src/patch/format.rs): read and
converted into our operations, or refused by name; and ours written so that LARQL reads them and
its REMOVE PATCH (which matches `description`) finds them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from larql.edit.patches.overlay import MetaOverride
from larql.edit.patches.patch import Patch, PatchOp, save_patch
from larql.edit.patches.weight_op import f32_b64 as b64
from larql.errors import LqlSemanticError
from larql.lql.executor import execute
from larql.lql.session import Session
from tests.synthetic import TinySpec, tiny_vindex

HIDDEN, FFN, LAYERS, VOCAB = 64, 96, 3, 257
IDS = [5, 80, 81, 120, 7]


@pytest.fixture(scope="module")
def vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("larqlvlp"), TinySpec("gemma3", n_layers=LAYERS, ffn=FFN), seed=5)


@pytest.fixture
def session(vx: Path) -> Session:
    s = Session()
    execute(f'USE "{vx}"', s)
    return s


GATE = np.linspace(-1, 1, HIDDEN).astype(np.float32)


def larql_doc(model: str, *ops: dict[str, Any]) -> dict[str, Any]:
    """A patch as LARQL's SAVE PATCH writes it: no format or name, created_at "", description null."""
    return {"version": 1, "base_model": model, "base_checksum": None, "created_at": "", "description": None,
            "author": None, "tags": [], "operations": list(ops)}


def larql_ops() -> list[dict[str, Any]]:
    return [
        {"op": "insert", "layer": 1, "feature": 5, "relation": "capital", "entity": "Atlantis", "target": "Poseidon",
         "confidence": 0.9, "gate_vector_b64": b64(GATE), "down_meta": {"t": "P", "i": 80, "c": 0.9}},
        {"op": "update", "layer": 2, "feature": 7, "gate_vector_b64": None, "down_meta": {"t": "x", "i": 120, "c": 0.25}},
        {"op": "delete", "layer": 0, "feature": 3, "reason": "noisy"},
    ]


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc, indent=2))  # serde_json::to_string_pretty's shape
    return path


def test_a_larql_patch_applies_as_its_native_equivalent(session: Session, tmp_path: Path) -> None:
    v = session.vindex
    model = v.index["model"]
    path = write(tmp_path / "larql.vlp", larql_doc(model, *larql_ops()))
    res = execute(f'APPLY PATCH "{path}"', session)[0]
    assert res.title.endswith("(3 operations: 1 inserts, 1 updates, 1 deletes)")
    assert v.feature_meta(1, 5).token_ids[0] == 80 and v.feature_meta(1, 5).scores[0] == pytest.approx(0.9)
    assert v.feature_meta(2, 7).token_ids[0] == 120 and v.feature_meta(2, 7).scores[0] == pytest.approx(0.25)
    ov = v.overlay[(1, 5)]
    assert np.array_equal(ov.gate, GATE) and ov.up is None and ov.down is None  # LARQL's insert: the gate only
    assert 3 in v.overlay.deleted(0)
    larql_logits = v.model().forward(IDS)
    execute('REMOVE PATCH "larql.vlp"', session)
    assert len(v.overlay) == 0

    native = Patch("n.vlp", None, [
        PatchOp("insert", 1, 5, {"gate": GATE}, MetaOverride((80,), (0.9,)), "Atlantis", "capital", "Poseidon"),
        PatchOp("update", 2, 7, meta=MetaOverride((120,), (0.25,))),
        PatchOp("delete", 0, 3, reason="noisy")], model)
    save_patch(native, tmp_path / "n.vlp", token_text=v.token_text)
    execute(f'APPLY PATCH "{tmp_path / "n.vlp"}"', session)
    assert np.array_equal(v.model().forward(IDS), larql_logits)


def test_larql_remove_patch_by_description(session: Session, tmp_path: Path) -> None:
    doc = larql_doc(session.vindex.index["model"], *larql_ops())
    doc["description"] = "medical facts"
    execute(f'APPLY PATCH "{write(tmp_path / "m.vlp", doc)}"', session)
    execute('REMOVE PATCH "medical facts"', session)  # LARQL's REMOVE PATCH matches the description
    assert session.vindex.patches.applied == []


def test_larqls_base_model_is_its_hugging_face_id(session: Session, tmp_path: Path) -> None:
    """LARQL records the id it extracted ("google/gemma-3-270m"), larql the alias or file stem
    ("gemma3-270m"): the same model when they agree without owner, case and punctuation."""
    model = session.vindex.index["model"]
    hf_id = "someorg/" + "-".join(model.upper())
    execute(f'APPLY PATCH "{write(tmp_path / "hf.vlp", larql_doc(hf_id, *larql_ops()))}"', session)
    assert len(session.vindex.patches.applied) == 1
    with pytest.raises(LqlSemanticError, match=f"made for 'google/other-model', the vindex in use holds '{model}' "
                                               f"\\(if that is this model under another name, set the patch's base_model"):
        execute(f'APPLY PATCH "{write(tmp_path / "o.vlp", larql_doc("google/other-model", *larql_ops()))}"', session)
    assert len(session.vindex.patches.applied) == 1


@pytest.mark.parametrize("op, expected", [
    ({"op": "insert_knn", "layer": 1, "entity": "Atlantis", "relation": "capital", "target": "Poseidon",
      "target_id": 80, "confidence": 1.0, "key_vector_b64": b64(GATE)},
     "operation 1: insert_knn \\(LARQL's KNN-store insert, a lookup after the logits\\) has no larql counterpart"),
    ({"op": "delete_knn", "entity": "Atlantis"}, "operation 1: delete_knn \\(removes LARQL KNN-store entries\\)"),
    ({"op": "insert", "layer": 1, "feature": 5, "entity": "a", "target": "b", "down_meta": {"t": "P", "i": 257, "c": 1}},
     "operation 1: down_meta's token id i must be an integer in 0..256, got 257"),
    ({"op": "update", "layer": 1, "feature": 5, "down_meta": {"ids": [8], "scores": [0.5], "t": "P", "i": -3, "c": 0.5}},
     "operation 1: down_meta's token id i must be an integer in 0..256, got -3"),
    ({"op": "update", "layer": 1, "feature": 5, "down_meta": {"ids": [8], "scores": [0.5], "i": 1 << 40}},
     f"operation 1: down_meta's token id i must be an integer in 0..256, got {1 << 40}"),
    ({"op": "update", "layer": 1, "feature": 5, "down_meta": {"ids": [8], "scores": [0.5], "i": 8, "c": None}},
     "operation 1: down_meta's c \\(c_score\\) must be a finite number, got 'None'"),
    ({"op": "update", "layer": 1, "feature": 5, "down_meta": {"ids": [8], "scores": [0.5], "t": ["P"]}},
     "operation 1: down_meta's t \\(the top token\\) must be a string"),
    ({"op": "insert", "layer": 1, "feature": 5, "entity": "a", "target": "b", "down_meta": {"t": "P", "i": -1, "c": 1}},
     "operation 1: down_meta's token id i must be an integer in 0..256, got -1"),
    ({"op": "insert", "layer": 1, "feature": 5, "entity": "a", "target": "b", "down_meta": {"t": "P", "i": 8, "c": "nan"}},
     "operation 1: down_meta's c \\(c_score\\) must be a finite number, got 'nan'"),
    ({"op": "update", "layer": 1, "feature": 5, "down_meta": {"t": 7, "i": 8, "c": 0.5}},
     "operation 1: down_meta's t \\(the top token\\) must be a string"),
    ({"op": "update", "layer": 1, "feature": 5, "down_meta": {"t": "P", "c": 0.5}},
     'operation 1: down_meta must be {"ids": \\[...\\], "scores": \\[...\\]} \\(or LARQL\'s {"t": token'),
    ({"op": "insert", "layer": 1, "feature": 5, "entity": "a", "target": "b", "confidence": "high"},
     "operation 1: confidence must be a finite number, got 'high'"),
])
def test_what_larql_writes_and_we_cannot_represent_is_refused_by_name(session: Session, tmp_path: Path,
                                                                      op: dict[str, Any], expected: str) -> None:
    import re

    ops = larql_ops()
    ops.insert(1, op)
    path = write(tmp_path / "k.vlp", larql_doc(session.vindex.index["model"], *ops))
    with pytest.raises(LqlSemanticError) as err:
        execute(f'APPLY PATCH "{path}"', session)
    message = str(err.value).splitlines()[0]
    assert re.search(expected, message), message
    assert len(session.vindex.overlay) == 0 and session.vindex.patches.applied == []  # refused whole


def larql_reads(doc: dict[str, Any]) -> None:
    """What LARQL's serde structs require (VindexPatch, PatchOp, PatchDownMeta); extra fields ignored."""
    assert isinstance(doc["version"], int) and isinstance(doc["base_model"], str)
    assert isinstance(doc["created_at"], str) and isinstance(doc["operations"], list)
    assert all(isinstance(t, str) for t in doc.get("tags", []))
    for op in doc["operations"]:
        assert op["op"] in ("insert", "update", "delete")
        assert isinstance(op["layer"], int) and isinstance(op["feature"], int)
        if op["op"] == "insert":
            assert isinstance(op["entity"], str) and isinstance(op["target"], str)
        if op.get("down_meta") is not None:
            m = op["down_meta"]
            assert isinstance(m["t"], str) and isinstance(m["i"], int) and isinstance(m["c"], float)


def test_ours_are_written_so_larql_reads_them_and_removes_them_by_name(session: Session, tmp_path: Path) -> None:
    v = session.vindex
    rng = np.random.default_rng(0)
    execute(f'BEGIN PATCH "{tmp_path / "edits.vlp"}"; DELETE FROM EDGES WHERE layer = 2 AND feature = 5; '
            'UPDATE EDGES SET target = "hello", confidence = 0.5 WHERE layer = 1 AND feature = 3', session)
    v.patches.record(PatchOp("insert", 0, 9, {"down": rng.standard_normal(HIDDEN).astype(np.float32)},
                             MetaOverride((70, 71), (2.0, 1.0))))  # no entity or target (as DIFF writes)
    execute("SAVE PATCH", session)
    doc = json.loads((tmp_path / "edits.vlp").read_text())
    larql_reads(doc)
    assert doc["description"] == "edits.vlp"  # what `REMOVE PATCH "edits.vlp"` in LARQL compares with
    update = next(op for op in doc["operations"] if op["op"] == "update")
    i = update["down_meta"]["i"]
    assert update["down_meta"]["t"] == v.token_text(i) and update["down_meta"]["c"] == pytest.approx(0.5)
    insert = next(op for op in doc["operations"] if op["op"] == "insert")
    assert insert["entity"] == "" and insert["down_meta"]["ids"] == [70, 71]  # both forms; ours wins on reading

    fresh = Session()
    execute(f'USE "{v.path}"; APPLY PATCH "{tmp_path / "edits.vlp"}"', fresh)
    op = next(o for o in fresh.vindex.patches.applied[0].ops if o.op == "insert")
    assert op.entity is None and op.meta == MetaOverride((70, 71), (2.0, 1.0))  # the round trip is exact
    assert fresh.vindex.patches.applied[0].facts() == []


def test_a_diff_patch_is_named_by_its_file(session: Session, tmp_path: Path) -> None:
    execute(f'DIFF CURRENT CURRENT INTO PATCH "{tmp_path / "d.vlp"}"', session)
    doc = json.loads((tmp_path / "d.vlp").read_text())
    larql_reads(doc)
    assert doc["description"] == "d.vlp"
