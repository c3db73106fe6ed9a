"""DIFF "a" "b" [INTO PATCH "p.vlp"]: every kind of edit shows with its status, the patch applied to
`a` gives `b`'s logits, and DIFFs that a patch cannot express are refused with nothing written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import larql
from larql.edit.patches.patch import PatchOp
from larql.edit.patches.weight_op import WeightOp
from larql.errors import LqlSemanticError
from larql.lql.executor import execute
from larql.lql.session import Session
from tests.synthetic import TinySpec, tiny_vindex

IDS = [5, 80, 81, 120, 7, 7, 9]
SPEC = TinySpec("gemma3", n_layers=4, ffn=96)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """a: a tiny vindex; b: a compiled from four kinds of edit."""
    root = tmp_path_factory.mktemp("diff")
    a = tiny_vindex(root, SPEC, seed=8)
    s = Session()
    execute(f'USE "{a}"', s)
    rng = np.random.default_rng(2)
    v = s.vindex
    v.patches.record(PatchOp("insert", 1, 30, {"gate": rng.standard_normal(64).astype(np.float32),
                                               "down": rng.standard_normal(64).astype(np.float32)}))
    v.patches.record(PatchOp("delete", 3, 9))
    w = rng.standard_normal((96, 1)).astype(np.float32)
    v.patches.record(WeightOp(2, 0.1 * rng.standard_normal((64, 1)).astype(np.float32), w, w))
    execute('UPDATE EDGES SET confidence = 0.5 WHERE layer = 0 AND feature = 5', s)
    execute(f'COMPILE CURRENT INTO VINDEX "{root / "b.vindex"}"', s)
    return a, root / "b.vindex"


def test_diff_reports_each_edit_and_its_patch_reproduces_b(pair: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = pair
    patch = tmp_path / "d.vlp"
    res = execute(f'DIFF "{a}" "{b}" LIMIT 1000 INTO PATCH "{patch}"')[0]
    rows = {(r[0], r[1]): (r[4], r[5]) for r in res.rows}
    assert rows[(0, 5)] == ("metadata", "meta")
    assert rows[(3, 9)] == ("deleted", "down, meta")
    assert rows[(1, 30)][0] == "modified" and rows[(1, 30)][1].startswith("gate, down")
    assert rows[(2, "")] == ("low_rank", "ffn_down, rank 1")  # a weight edit moves every column: one op
    assert len(rows) == 1 + 1 + 1 + 1 and res.notes[0] == "4 difference(s), 4 shown (limit 1000)"
    s = Session()
    execute(f'USE "{a}"; APPLY PATCH "{patch}"', s)
    want = larql.load(b).dense().forward(IDS)
    got = s.vindex.model().forward(IDS)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    assert np.max(np.abs(larql.load(a).dense().forward(IDS) - want)) > 1e-2  # the patch did something
    assert s.vindex.feature_meta(0, 5).scores[0] == pytest.approx(0.5)
    # the same DIFF from CURRENT, filtered to a layer, and a vindex against itself
    s2 = Session()
    layer3 = execute(f'USE "{a}"; DIFF CURRENT "{b}" LAYER 3', s2)[-1]
    assert [r[:2] for r in layer3.rows] == [[3, 9]]
    assert execute(f'DIFF "{a}" "{a}"')[0].notes[0] == "0 difference(s), 0 shown (limit 20)"


def test_diffs_a_patch_cannot_carry_are_refused(pair: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = pair
    other = tiny_vindex(tmp_path, SPEC, seed=9)  # same shapes, other weights: attention differs too
    res = execute(f'DIFF "{a}" "{other}" LIMIT 1000')[0]
    assert any(r[4] == "dense" and r[5] == "blk.0.attn_q.weight" for r in res.rows)
    with pytest.raises(LqlSemanticError, match="differs in token_embd.weight, blk.0.attn_norm.weight, "
                                               "blk.0.attn_q.weight and .* more, outside the FFN"):
        execute(f'DIFF "{a}" "{other}" INTO PATCH "{tmp_path / "x.vlp"}"')
    assert not (tmp_path / "x.vlp").exists()
    (tmp_path / "o").mkdir()
    smaller = tiny_vindex(tmp_path / "o", TinySpec("gemma3", n_layers=2, ffn=96), seed=8)
    with pytest.raises(LqlSemanticError, match="DIFF needs two vindexes of one model: .* has num_layers 4"):
        execute(f'DIFF "{a}" "{smaller}"')
    with pytest.raises(LqlSemanticError, match="DIFF ... RELATION is not supported"):
        execute(f'DIFF "{a}" "{smaller}" RELATION "capital"')


def test_a_rome_edit_diffs_to_rank_one_factors(tmp_path: Path) -> None:
    """DIFF of a base and a ROME-edited copy: one weight_edit of rank 1, r(hidden + 2 ffn) floats
    (U, V and the keys) instead of an insert per feature, and applied it gives the copy's logits."""
    import json

    a = tiny_vindex(tmp_path, SPEC, seed=8)
    s = Session()
    execute(f'USE "{a}"', s)
    execute('INSERT INTO EDGES (entity, relation, target, prompt) VALUES ("zeta", "colour", "blue", '
            '"Colour of zeta") AT LAYER 1 METHOD ROME', s)
    (edit,) = s.vindex.patches.pending
    execute(f'COMPILE CURRENT INTO VINDEX "{tmp_path / "rome.vindex"}"', s)
    patch = tmp_path / "d.vlp"
    res = execute(f'DIFF "{a}" "{tmp_path / "rome.vindex"}" INTO PATCH "{patch}"')[0]
    assert res.rows == [[1, "", "", "", "low_rank", "ffn_down, rank 1"]]
    (op,) = json.loads(patch.read_text())["operations"]
    assert (op["op"], op["layer"], op["rank"], op["method"]) == ("weight_edit", 1, 1, "diff")
    floats = 1 * (64 + 2 * 96)  # r (hidden + 2 ffn): U, V, keys
    assert patch.stat().st_size < 4 * floats * 4 / 3 + 1500  # base64 float32 plus the JSON around it
    dense = 96 * 64  # what the per-feature form carried for W_down alone (it carries gate and up too)
    assert floats * 20 < dense
    # the factors are the edit's own product, to float32 rounding
    d = WeightOp.from_json(op, "d.vlp", 64, 96, 4)
    assert np.max(np.abs(d.u @ d.v.T - edit.u @ edit.v.T)) <= 1e-5 * np.max(np.abs(edit.u @ edit.v.T))
    s2 = Session()
    execute(f'USE "{a}"; APPLY PATCH "{patch}"', s2)
    want = larql.load(tmp_path / "rome.vindex").dense().forward(IDS)
    got = s2.vindex.model().forward(IDS)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    assert np.max(np.abs(larql.load(a).dense().forward(IDS) - want)) > 1e-3  # the edit moved the logits
    s3 = Session()  # MERGE of the edited vindex takes the same route: one weight edit, the same logits
    merged = execute(f'USE "{a}"; MERGE "{tmp_path / "rome.vindex"}"', s3)[-1]
    assert merged.title.startswith("Merged vindex") and [op.rank for op in s3.vindex.patches.pending] == [1]
    got = s3.vindex.model().forward(IDS)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


def test_factors_only_where_they_are_smaller(tmp_path: Path) -> None:
    """A rank-2 change of every column (two facts in one MEMIT-like solve) becomes factors; a rank-3
    change of three columns stays three inserts (3 x 3 x 64 floats against 3 x (64 + 2 x 96))."""
    from larql.edit.maintain.diff import diff, low_rank
    from larql.edit.state.view import edit_vindex

    a = tiny_vindex(tmp_path, SPEC, seed=8)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((96, 64)).astype(np.float32)
    few = np.zeros((96, 3), dtype=np.float32)
    few[[4, 50, 90], [0, 1, 2]] = 1.0
    for k, rows in ((rng.standard_normal((96, 2)).astype(np.float32), 1), (few, 3)):
        ua = 0.05 * rng.standard_normal((64, k.shape[1])).astype(np.float32)
        b = (w + (ua @ k.T).T).astype(np.float32)
        found = low_rank(w, b)
        assert (found is None) == (rows == 3)
        if found is not None:
            assert found[0].shape == (64, 2) and np.max(np.abs(found[0] @ found[1].T - (b - w).T)) < 1e-6
        v = edit_vindex(a)
        v.patches.record(WeightOp(2, ua, k, k))
        got = [r for r in diff(edit_vindex(a), v, 2).rows if r.layer == 2]
        assert len(got) == rows and (got[0].status == "low_rank") == (rows == 1)
