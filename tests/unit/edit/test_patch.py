"""The patch overlay through LQL on a tiny vindex: DELETE / UPDATE / INSERT change what browsing and
inference see, patches save, re-apply and remove exactly, bad patch files fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import larql
from larql.edit.state.view import edit_vindex
from larql.errors import LqlSemanticError, LqlSyntaxError, VindexError
from larql.lql.executor import execute
from larql.lql.session import Session
from larql.vindex.store import open_vindex
from tests.synthetic import TinySpec, tiny_vindex

IDS = [5, 80, 81, 120, 7, 7, 9]


@pytest.fixture(scope="module")
def vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("patch"), TinySpec("gemma3", n_layers=4, ffn=96), seed=11)


def session_on(vx: Path) -> Session:
    s = Session()
    execute(f'USE "{vx}"', s)
    return s


def test_delete_silences_the_feature_everywhere(vx: Path) -> None:
    s = session_on(vx)
    v = s.vindex
    base = v.model().forward(IDS)
    gate = v.gate_vectors(2)[17].astype(np.float32)
    assert v.gate_knn(2, gate, 1)[0][0] == 17
    res = execute("DELETE FROM EDGES WHERE layer = 2 AND feature = 17", s)[0]
    assert res.title == "Deleted 1 feature(s) (patch overlay)"
    assert 17 not in [f for f, _ in v.gate_knn(2, gate, 5)]  # KNN no longer returns it
    ids, scores = v.down_meta(2)
    assert ids[17].sum() == 0 and scores[17].sum() == 0  # browsing sees an empty feature
    expected = larql.load(vx.parent / "m.gguf").forward(
        IDS, hooks={"blocks.2.mlp.hook_post": lambda x, n: np.where(np.arange(x.shape[1]) == 17, 0, x)})
    assert np.allclose(v.model().forward(IDS), expected, atol=1e-5)  # inference: the feature writes nothing
    assert not np.allclose(v.model().forward(IDS), base)
    assert np.array_equal(v.model().dense().forward(IDS), base)  # the base is untouched


def test_update_changes_metadata_only(vx: Path) -> None:
    s = session_on(vx)
    v = s.vindex
    before = v.model().forward(IDS)
    execute('UPDATE EDGES SET target = "hello", confidence = 0.5 WHERE layer = 1 AND feature = 3', s)
    meta = v.feature_meta(1, 3)
    assert meta.token_ids[0] == v.tokenizer.tok.encode(" hello", add_special_tokens=False).ids[0]
    assert meta.scores[0] == pytest.approx(0.5)
    rows = execute("SELECT * FROM EDGES WHERE layer = 1 AND feature = 3", s)[0].dicts()
    assert rows[0]["score"] == pytest.approx(0.5)
    assert np.array_equal(v.model().forward(IDS), before)
    with pytest.raises(LqlSyntaxError, match="expected ',' or WHERE"):
        execute('UPDATE EDGES SET confidence = 0.1', s)
    with pytest.raises(LqlSemanticError, match="cannot SET layer"):
        execute('UPDATE EDGES SET layer = 2 WHERE layer = 1 AND feature = 3', s)


def test_patch_save_apply_remove_round_trip(vx: Path, tmp_path: Path) -> None:
    s = session_on(vx)
    base = s.vindex.model().forward(IDS)
    patch = tmp_path / "edits.vlp"
    execute(f'BEGIN PATCH "{patch}"; DELETE FROM EDGES WHERE layer = 3 AND feature = 5; '
            'UPDATE EDGES SET confidence = 0.25 WHERE layer = 0 AND feature = 1', s)
    rng = np.random.default_rng(0)
    from larql.edit.patches.overlay import FeatureOverride
    from larql.edit.patches.patch import PatchOp

    s.vindex.patches.record(PatchOp("insert", 1, 9, {"down": rng.standard_normal(64).astype(np.float32),
                                                     "gate": rng.standard_normal(64).astype(np.float32)}))
    edited = s.vindex.model().forward(IDS)
    saved = execute("SAVE PATCH", s)[0]
    assert saved.title.endswith("(3 operations: 1 inserts, 1 updates, 1 deletes)")
    doc = json.loads(patch.read_text())
    assert doc["name"] == "edits.vlp" and doc["base_model"] and len(doc["base_checksum"]) == 64

    fresh = session_on(vx)  # a new session sees the base until the patch is applied
    assert np.array_equal(fresh.vindex.model().forward(IDS), base)
    execute(f'APPLY PATCH "{patch}"', fresh)
    assert np.array_equal(fresh.vindex.model().forward(IDS), edited)
    assert fresh.vindex.feature_meta(0, 1).scores[0] == pytest.approx(0.25)
    shown = execute("SHOW PATCHES", fresh)[0]
    assert shown.rows[0][1:6] == ["edits.vlp", 3, 1, 1, 1]
    with pytest.raises(LqlSemanticError, match="already applied"):
        execute(f'APPLY PATCH "{patch}"', fresh)
    execute('REMOVE PATCH "edits.vlp"', fresh)
    assert np.array_equal(fresh.vindex.model().forward(IDS), base) and len(fresh.vindex.overlay) == 0
    assert isinstance(FeatureOverride(), FeatureOverride)


def test_patch_statement_errors(vx: Path, tmp_path: Path) -> None:
    s = session_on(vx)
    with pytest.raises(LqlSemanticError, match="no patch is being recorded; start one with BEGIN PATCH"):
        execute("SAVE PATCH", s)
    with pytest.raises(LqlSemanticError, match="no such patch file"):
        execute(f'APPLY PATCH "{tmp_path / "missing.vlp"}"', s)
    bad = tmp_path / "bad.vlp"
    bad.write_text("{not json")
    with pytest.raises(LqlSemanticError, match="not a patch file"):
        execute(f'APPLY PATCH "{bad}"', s)
    wrong = tmp_path / "wrong.vlp"
    wrong.write_text(json.dumps({"version": 1, "operations": [
        {"op": "insert", "layer": 0, "feature": 1, "down_vector_b64": "AAAAAA=="}]}))
    with pytest.raises(LqlSemanticError, match="down vector has 1 values; this vindex's hidden size is 64"):
        execute(f'APPLY PATCH "{wrong}"', s)
    out_of_range = tmp_path / "range.vlp"
    out_of_range.write_text(json.dumps({"version": 1, "operations": [{"op": "delete", "layer": 9, "feature": 1}]}))
    with pytest.raises(LqlSemanticError, match=r"range.vlp operation 0: layer must be an integer in 0\.\.3, got 9"):
        execute(f'APPLY PATCH "{out_of_range}"', s)
    assert len(s.vindex.overlay) == 0 and s.vindex.patches.applied == []  # a failed apply leaves nothing
    with pytest.raises(LqlSemanticError, match="no applied patch named 'x.vlp'"):
        execute('REMOVE PATCH "x.vlp"', s)
    execute(f'BEGIN PATCH "{tmp_path / "a.vlp"}"', s)
    with pytest.raises(LqlSemanticError, match="already being recorded"):
        execute(f'BEGIN PATCH "{tmp_path / "b.vlp"}"', s)
    with pytest.raises(LqlSemanticError, match="MODE KNN"):
        execute('INSERT INTO EDGES (entity, relation, target) VALUES ("a", "b", "c") MODE KNN', s)


def test_insert_raises_the_target_on_a_tiny_model(vx: Path) -> None:
    s = session_on(vx)
    res = execute('INSERT INTO EDGES (entity, relation, target) VALUES ("zeta", "colour", "blue") AT LAYER 2 '
                  'METHOD FEATURE', s)[0]
    rows = {r[0]: r[1:] for r in res.rows}
    p_key = next(k for k in rows if k.startswith("p("))
    p_before, p_after = rows[p_key]
    # a random tiny model's distributions are extremely peaked: measure the gain in log-probability
    # (the real-model test in tests/parity/test_editing.py asserts the probability itself)
    assert np.log(p_after) - np.log(p_before) > 5.0
    assert rows["rank of the target"][1] < rows["rank of the target"][0]
    op = s.vindex.patches.pending[-1]
    assert op.op == "insert" and op.layer == 2 and set(op.vectors) == {"gate", "up", "down"}
    m = s.vindex.model()
    target = op.meta.token_ids[0]
    from larql.model.generate import log_softmax

    p_now = float(np.exp(log_softmax(m.next_logits(m.tokenize("The colour of zeta is")))[target]))
    assert p_now == pytest.approx(p_after, rel=1e-2)  # the recorded edit is what was measured
    with pytest.raises(VindexError):
        edit_vindex(vx).patches.save()


def test_compile_bakes_the_overlay_into_a_new_vindex(vx: Path, tmp_path: Path) -> None:
    s = session_on(vx)
    rng = np.random.default_rng(3)
    from larql.edit.patches.patch import PatchOp

    s.vindex.patches.record(PatchOp("insert", 2, 40, {"gate": rng.standard_normal(64).astype(np.float32),
                                                      "up": rng.standard_normal(64).astype(np.float32),
                                                      "down": rng.standard_normal(64).astype(np.float32)}))
    execute('DELETE FROM EDGES WHERE layer = 1 AND feature = 8; '
            'UPDATE EDGES SET confidence = 0.75 WHERE layer = 3 AND feature = 2', s)
    live = s.vindex.model().forward(IDS)
    before_files = {p.name: p.read_bytes() for p in vx.iterdir()}
    res = execute(f'COMPILE CURRENT INTO VINDEX "{tmp_path / "baked.vindex"}"', s)[0]
    assert {r[0]: r[1] for r in res.rows}["layers with rewritten FFN weights"] == "1, 2"
    assert res.rows[2] == ["FFN width of every layer (wider: features NEURON added)", s.vindex.store.num_features(1)]
    baked = open_vindex(tmp_path / "baked.vindex")
    assert baked.verify() == [] and baked.index["compiled_from"]["edited_features"] == 3
    out = larql.load(tmp_path / "baked.vindex").forward(IDS)  # no patch: the edits are in the weights
    assert np.max(np.abs(out - live)) <= 1e-4 * np.max(np.abs(live))
    assert baked.feature_meta(3, 2).scores[0] == pytest.approx(0.75)
    assert baked.down_meta(1)[0][8].sum() == 0 and np.all(baked.gate_vectors(1)[8] == 0)
    assert {p.name: p.read_bytes() for p in vx.iterdir()} == before_files  # the base is untouched
    with pytest.raises(LqlSemanticError, match="already exists"):
        execute(f'COMPILE CURRENT INTO VINDEX "{tmp_path / "baked.vindex"}"', s)
    with pytest.raises(LqlSemanticError, match="is the vindex in use.*read-only"):
        execute(f'COMPILE CURRENT INTO VINDEX "{vx}"', s)


def test_compile_on_conflict_fail(vx: Path, tmp_path: Path) -> None:
    s = session_on(vx)
    for name, conf in (("a.vlp", 0.1), ("b.vlp", 0.2)):
        execute(f'BEGIN PATCH "{tmp_path / name}"; UPDATE EDGES SET confidence = {conf} '
                'WHERE layer = 0 AND feature = 4; SAVE PATCH', s)
    with pytest.raises(LqlSemanticError, match=r"1 feature\(s\) are written by more than one patch \(L0 F4\)"):
        execute(f'COMPILE CURRENT INTO VINDEX "{tmp_path / "c.vindex"}" ON CONFLICT FAIL', s)
    assert not (tmp_path / "c.vindex").exists()
    res = execute(f'COMPILE CURRENT INTO VINDEX "{tmp_path / "c.vindex"}"', s)[0]  # LAST_WINS by default
    assert {r[0]: r[1] for r in res.rows}["features written by several patches"] == 1
    assert open_vindex(tmp_path / "c.vindex").feature_meta(0, 4).scores[0] == pytest.approx(0.2)


def test_compile_into_gguf_runs_the_edited_model(vx: Path, tmp_path: Path) -> None:
    s = session_on(vx)
    rng = np.random.default_rng(5)
    from larql.edit.patches.patch import PatchOp

    s.vindex.patches.record(PatchOp("insert", 1, 30, {"gate": rng.standard_normal(64).astype(np.float32),
                                                      "down": rng.standard_normal(64).astype(np.float32)}))
    execute("DELETE FROM EDGES WHERE layer = 3 AND feature = 9", s)
    live = s.vindex.model().forward(IDS)
    out = tmp_path / "edited.gguf"
    res = execute(f'COMPILE CURRENT INTO MODEL "{out}" FORMAT GGUF', s)[0]
    assert {r[0]: r[1] for r in res.rows}["layers with rewritten FFN weights"] == "1, 3"
    compiled = larql.load(out)  # a plain GGUF: metadata and tokenizer copied from the source
    assert np.max(np.abs(compiled.forward(IDS) - live)) <= 1e-4 * np.max(np.abs(live))
    base = larql.load(vx.parent / "m.gguf")
    assert compiled.config == base.config and compiled.tokenize("hello there") == base.tokenize("hello there")
    assert compiled.weights.layers[1].down.qtype.name == "F32" and compiled.weights.layers[0].down.qtype.name == "Q8_0"
    with pytest.raises(LqlSemanticError, match="already exists"):
        execute(f'COMPILE CURRENT INTO MODEL "{out}" FORMAT GGUF', s)
