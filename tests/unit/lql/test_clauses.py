"""Every optional clause of the grammar is honoured (the result changes as the clause says) or
refused with the reason and what to write instead (larql/lql/clauses.py). DESCRIBE's, SHOW
ENTITIES' and SHOW RELATIONS' clauses need a real vocabulary: tests/parity/test_clauses_real.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from larql.errors import LqlSemanticError
from larql.lql.executor import execute
from larql.lql.parser import parse
from larql.lql.planner import plan
from larql.lql.result import Result
from larql.lql.session import Session
from larql.vindex.store import open_vindex


def one(vindex: Path, text: str) -> Result:
    return execute(f'USE "{vindex}"; {text}')[1]


def per_layer(res: Result) -> dict[int, int]:
    return dict(Counter(r[0] for r in res.rows if r[0] != ""))


def plan_text(vindex: Path, text: str) -> str:
    return plan(parse(text)[0], Session(vindex=open_vindex(vindex))).to_text()


def test_walk_top_and_layers(vx: Path) -> None:
    default = one(vx, 'WALK "abc"')
    assert per_layer(default) == {0: 3, 1: 3, 2: 3, 3: 3}
    top7 = one(vx, 'WALK "abc" TOP 7')
    assert per_layer(top7) == {0: 7, 1: 7, 2: 7, 3: 7}
    assert [r for r in top7.rows if r[0] == 2][:3] == [r for r in default.rows if r[0] == 2]
    assert per_layer(one(vx, 'WALK "abc" TOP 2 LAYERS 1-2')) == {1: 2, 2: 2}
    assert one(vx, 'WALK "abc" LAYERS ALL').rows == default.rows  # ALL is the default, said out loud
    assert "top 7 per layer" in plan_text(vx, 'WALK "abc" TOP 7')


def test_explain_walk_clauses(vx: Path) -> None:
    default = one(vx, 'EXPLAIN WALK "abc"')
    assert set(per_layer(default).values()) == {5}
    assert set(per_layer(one(vx, 'EXPLAIN WALK "abc" TOP 2')).values()) == {2}
    verbose = one(vx, 'EXPLAIN WALK "abc" VERBOSE')
    assert set(per_layer(verbose).values()) == {10}
    def most_down(res: Result) -> int:
        return max(len(r[4].split(", ")) for r in res.rows)

    assert most_down(default) <= 3 < most_down(verbose) <= 5
    assert set(per_layer(one(vx, 'EXPLAIN WALK "abc" LAYERS 1-1'))) == {1}
    lo, hi = open_vindex(vx).index["layer_bands"]["knowledge"]
    assert set(per_layer(one(vx, 'EXPLAIN WALK "abc" KNOWLEDGE'))) == set(range(lo, hi + 1))
    assert one(vx, 'EXPLAIN WALK "abc" RELATIONS ONLY').rows == []  # no feature of a tiny model has a label


def test_select_clauses(vx: Path) -> None:
    everything = one(vx, "SELECT * FROM EDGES WHERE layer = 2 LIMIT 1000")
    assert {r[0] for r in everything.rows} == {2} and len(everything.rows) == 96
    assert len(one(vx, "SELECT * FROM EDGES LIMIT 3").rows) == 3
    asc = one(vx, "SELECT feature, score FROM EDGES WHERE layer = 1 ORDER BY score ASC LIMIT 96")
    desc = one(vx, "SELECT feature, score FROM EDGES WHERE layer = 1 ORDER BY score DESC LIMIT 96")
    assert asc.columns == ["feature", "score"] and len(asc.rows) == 96
    assert [r[1] for r in asc.rows] == sorted(r[1] for r in asc.rows) == [r[1] for r in desc.rows][::-1]
    near = one(vx, 'SELECT feature FROM EDGES NEAREST TO "abc" AT LAYER 1 LIMIT 10')
    kept = one(vx, f'SELECT feature FROM EDGES NEAREST TO "abc" AT LAYER 1 WHERE feature != {near.rows[0][0]} LIMIT 10')
    assert kept.rows == near.rows[1:]  # WHERE applies to NEAREST too
    ordered = one(vx, 'SELECT feature FROM EDGES NEAREST TO "abc" AT LAYER 1 ORDER BY feature ASC LIMIT 10')
    assert ordered.rows == sorted(near.rows)
    with pytest.raises(LqlSemanticError, match='unknown column "nosuchcol"; columns are layer, feature, token, also'):
        one(vx, "SELECT nosuchcol FROM EDGES")
    with pytest.raises(LqlSemanticError, match='unknown column "layer"; columns are token, count, max_score'):
        one(vx, "SELECT layer FROM ENTITIES")


def test_show_clauses(vx: Path) -> None:
    assert [r[0] for r in one(vx, "SHOW LAYERS").rows] == [0, 1, 2, 3]
    assert [r[0] for r in one(vx, "SHOW LAYERS 1-2").rows] == [1, 2]
    assert len(one(vx, "SHOW FEATURES 1 LIMIT 2").rows) == 2
    low = one(vx, "SHOW FEATURES 1 WHERE score < 1.0 LIMIT 1000")
    high = one(vx, "SHOW FEATURES 1 WHERE score >= 1.0 LIMIT 1000")
    assert all(r[2] < 1.0 for r in low.rows) and all(r[2] >= 1.0 for r in high.rows)
    assert len(low.rows) + len(high.rows) == 96 and low.rows and high.rows
    stats = execute(f'STATS "{vx}"')[0]  # STATS "path" needs no USE
    assert dict(stats.rows)["layers"] == 4


def test_infer_trace_crown_clauses(vxi: Path, tmp_path: Path) -> None:
    assert len(one(vxi, 'INFER "a b"').rows) == 5 and len(one(vxi, 'INFER "a b" TOP 2').rows) == 2
    assert one(vxi, 'INFER "a b" COMPARE').columns[1:3] == ["walk token", "walk prob"]
    ex = one(vxi, 'EXPLAIN INFER "a b"')
    assert per_layer(ex) == {0: 3, 1: 3, 2: 3, 3: 3}
    assert per_layer(one(vxi, 'EXPLAIN INFER "a b" TOP 4 LAYERS 1-2')) == {1: 4, 2: 4}
    assert set(per_layer(one(vxi, 'EXPLAIN INFER "a b" VERBOSE')).values()) == {10}
    assert one(vxi, 'EXPLAIN INFER "a b" WITH ATTENTION').columns[-2:] == ["attends_to", "lens_top1"]
    lo, hi = open_vindex(vxi).index["layer_bands"]["syntax"]
    assert set(per_layer(one(vxi, 'EXPLAIN INFER "a b" SYNTAX'))) == set(range(lo, hi + 1))
    assert one(vxi, 'EXPLAIN INFER "a b" RELATIONS ONLY').rows == []
    trace = one(vxi, 'TRACE "a b"')
    assert [r[0] for r in trace.rows] == ["emb", "L0", "L1", "L2", "L3"]
    assert [r[0] for r in one(vxi, 'TRACE "a b" LAYERS 1-2').rows] == ["emb", "L1", "L2"]
    assert one(vxi, 'TRACE "a b" DECOMPOSE').columns[-1] == "attn%"
    assert one(vxi, 'TRACE "a b" FOR "b"').columns != trace.columns
    assert len(one(vxi, 'TRACE "a b" POSITIONS ALL').rows) > len(trace.rows)
    one(vxi, f'TRACE "a b" POSITIONS ALL SAVE "{tmp_path / "t.trace"}"')
    assert (tmp_path / "t.trace").stat().st_size > 0
    crown = one(vxi, 'CROWN "a b" FOR "b"')
    with_subject = one(vxi, 'CROWN "a b" FOR "b" SUBJECT "a"')
    assert len(with_subject.columns) == len(crown.columns) + 3


def test_insert_extract_compile_clauses_change_the_plan(vxi: Path) -> None:
    rome = plan_text(vxi, 'INSERT INTO EDGES (entity, relation, target) VALUES ("A", "capital", "B")')
    assert "at layer 1" in rome  # the default layer of a 4-layer model
    assert "layer 2" in plan_text(vxi, 'INSERT INTO EDGES (entity, relation, target) VALUES ("A", "r", "B") AT LAYER 2')
    memit = plan_text(vxi, 'INSERT INTO EDGES (entity, relation, target) VALUES ("A", "r", "B") METHOD MEMIT')
    assert "one joint solve" in memit and "one joint solve" not in rome
    feature = plan_text(vxi, 'INSERT INTO EDGES (entity, relation, target) VALUES ("A", "r", "B") METHOD FEATURE '
                             "CONFIDENCE 0.8")
    assert "until p(target) >= 0.8" in feature
    assert "level=inference" in plan_text(vxi, 'EXTRACT MODEL "m" INTO "o.vindex" WITH INFERENCE')
    assert "level=browse" in plan_text(vxi, 'EXTRACT MODEL "m" INTO "o.vindex"')
    assert "on conflict fail" in plan_text(vxi, 'COMPILE CURRENT INTO VINDEX "o" ON CONFLICT FAIL')


@pytest.mark.parametrize("text, message", [
    ('USE MODEL "gemma3-270m" AUTO_EXTRACT', "AUTO_EXTRACT is not supported"),
    ('EXTRACT MODEL "m" INTO "o" COMPONENTS gate', "COMPONENTS is not supported: every component is extracted"),
    ('EXTRACT MODEL "m" INTO "o" LAYERS 0-1', "LAYERS is not supported: every layer is extracted"),
    ('WALK "abc" MODE DENSE', "WALK ... MODE is not supported"),
    ('WALK "abc" COMPARE', "WALK ... COMPARE is not supported"),
    ('INSERT INTO EDGES (entity, relation, target) VALUES ("A", "r", "B") ALPHA 2', "ALPHA is not supported"),
    ('INSERT INTO EDGES (entity, relation, target) VALUES ("A", "r", "B") CONFIDENCE 0.8',
     "CONFIDENCE applies to METHOD FEATURE with one row only"),
    ("SHOW RELATIONS RAW", "RAW is not supported"),
])
def test_refused_clauses_name_the_reason_and_the_fix(vxi: Path, text: str, message: str) -> None:
    with pytest.raises(LqlSemanticError) as e:
        execute(f'USE "{vxi}"; {text}')
    assert message in str(e.value) and "hint: " in str(e.value)


def test_insert_mode_knn_is_refused(vxi: Path) -> None:
    with pytest.raises(LqlSemanticError, match="MODE KNN .* is not supported"):
        execute(f'USE "{vxi}"; INSERT INTO EDGES (entity, relation, target) VALUES ("A", "r", "B") MODE KNN')
