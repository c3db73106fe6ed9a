"""Planner and executor on a tiny extracted vindex: results are values, errors are located."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from larql.edit.state.view import edit_vindex
from larql.errors import LqlSemanticError
from larql.lql.executor import execute
from larql.lql.parser import parse
from larql.lql.planner import plan
from larql.lql.session import AttachedSae, Session
from larql.model.sae import SAE
from larql.vindex import browse


def run(vx: Path, text: str):  # type: ignore[no-untyped-def]
    return execute(f'USE "{vx}"; ' + text)[1:]


def test_use_and_stats(vx: Path) -> None:
    use, stats = execute(f'USE "{vx}"; STATS')
    assert "Using:" in use.notes[0] and "4 layers" in use.notes[0]
    props = dict(stats.rows)
    assert props["layers"] == 4 and props["model weights"] == "no" and props["dtype"] == "f16"


def test_select_edges_filters_orders_and_limits(vx: Path) -> None:
    v = edit_vindex(vx)
    (res,) = run(vx, "SELECT * FROM EDGES WHERE layer = 2 AND score > 0 ORDER BY score DESC LIMIT 5")
    expected = sorted((h for h in browse.iter_features(v, [2]) if h.score > 0), key=lambda h: -h.score)[:5]
    assert [(r[0], r[1]) for r in res.rows] == [(h.layer, h.feature) for h in expected]
    assert res.columns == ["layer", "feature", "token", "also", "relation", "score"]
    (near,) = run(vx, 'SELECT * FROM EDGES NEAREST TO "abc" AT LAYER 1 LIMIT 4')
    assert [r[1] for r in near.rows] == [f for f, _ in v.gate_knn(1, v.entity_embedding("abc"), 4)]
    (feats,) = run(vx, "SELECT * FROM FEATURES WHERE layer = 0 AND feature IN (3, 5)")
    assert [r[1] for r in feats.rows] == [3, 5]
    (like,) = run(vx, f'SELECT * FROM FEATURES WHERE layer = 0 AND token LIKE "{feats.rows[0][2][:1]}%"')
    assert like.rows and all(r[2].lower().startswith(feats.rows[0][2][:1].lower()) for r in like.rows)


def test_walk_describe_and_shows(vx: Path) -> None:
    walk, explain, layers, features = run(
        vx, 'WALK "hello" TOP 2 LAYERS 1-2; EXPLAIN WALK "hello" VERBOSE; SHOW LAYERS 0-1; SHOW FEATURES 3 LIMIT 4')
    assert {r[0] for r in walk.rows} == {1, 2} and len(walk.rows) == 4
    assert {r[0] for r in explain.rows} == {0, 1, 2, 3}
    assert [r[0] for r in layers.rows] == [0, 1] and len(features.rows) == 4
    (card,) = run(vx, 'DESCRIBE "hello" VERBOSE')
    assert card.title == "hello" and card.notes[0].startswith(("signal:", "(not found)"))
    assert card.to_json()["statement"] == 'DESCRIBE "hello" VERBOSE'


def test_semantic_errors_are_located() -> None:
    with pytest.raises(LqlSemanticError) as e:
        execute('STATS;\nDESCRIBE "France"')
    assert e.value.message == "no vindex in use" and e.value.line == 1
    with pytest.raises(LqlSemanticError, match="no vindex in use"):
        execute('MERGE "other.vindex"')
    with pytest.raises(LqlSemanticError, match="no vindex in use"):
        execute('COMPILE CURRENT INTO MODEL "out/" FORMAT SAFETENSORS')
    with pytest.raises(LqlSemanticError, match="no vindex in use"):
        execute('BEGIN PATCH "p.vlp"')


def test_layer_out_of_range_and_plans(vx: Path) -> None:
    with pytest.raises(LqlSemanticError) as e:
        run(vx, 'DESCRIBE "x" AT LAYER 9')
    assert "layer 9 is out of range: this vindex has layers 0-3" in str(e.value) and e.value.column > 1
    session = Session(vindex=edit_vindex(vx))
    (stmt,) = parse('WALK "The capital of France is" TOP 3 LAYERS 1-2')
    assert plan(stmt, session).to_text() == (
        'PLAN WALK "The capital of France is" TOP 3 LAYERS 1-2\n'
        "  1. tokenize  'The capital of France is'\n"
        "  2. last_token_embedding  scaled\n"
        "  3. gate_knn  layers 1-2, top 3 per layer")


def test_plans_are_golden(vx: Path, vxi: Path, update_golden: bool) -> None:
    session = Session(vindex=edit_vindex(vx))
    texts = ['USE "x.vindex"', 'EXTRACT MODEL "m" INTO "o.vindex" WITH INFERENCE', "STATS", "SHOW MODELS",
             'DESCRIBE "France" VERBOSE', 'DESCRIBE "France" AT LAYER 2', 'WALK "The capital" TOP 3 LAYERS 0-1',
             'EXPLAIN WALK "x" VERBOSE', 'SELECT * FROM EDGES WHERE entity = "Par" AND score > 0.1 ORDER BY score DESC',
             'SELECT * FROM EDGES NEAREST TO "France" AT LAYER 1 LIMIT 5', "SELECT * FROM ENTITIES LIMIT 3",
             "SHOW LAYERS 0-1", "SHOW FEATURES 2 LIMIT 4", "SHOW ENTITIES AT LAYER 1", "SHOW RELATIONS",
             'WALK "a" |> DESCRIBE "b"', 'DELETE FROM EDGES WHERE layer = 1 AND feature = 2',
             'UPDATE EDGES SET target = "x" WHERE entity = "Par"', 'BEGIN PATCH "p.vlp"', "SAVE PATCH",
             'APPLY PATCH "p.vlp"', 'REMOVE PATCH "p.vlp"', "SHOW PATCHES",
             'COMPILE CURRENT INTO VINDEX "o.vindex" ON CONFLICT FAIL', 'COMPILE "a.vindex" INTO MODEL "o.gguf" FORMAT GGUF',
             'COMPILE CURRENT INTO MODEL "out/" FORMAT SAFETENSORS', 'COMPILE CURRENT INTO MODEL "o.gguf"',
             'DIFF "a.vindex" CURRENT LAYER 2 LIMIT 5 INTO PATCH "d.vlp"', 'MERGE "theirs.vlp"',
             'MERGE "b.vindex" ON CONFLICT FAIL', 'MERGE "b.vlp" ON CONFLICT KEEP_SOURCE',
             'MERGE "b.vlp" ON CONFLICT KEEP_TARGET', 'MERGE "b.vlp" ON CONFLICT HIGHEST_CONFIDENCE',
             "COMPACT MINOR", "COMPACT", "SHOW COMPACT STATUS", 'BEGIN PATCH "p.vlp" FORCE',
             'COMPILE CURRENT INTO VINDEX "o.vindex" FORCE', 'DIFF "a.vindex" CURRENT INTO PATCH "d.vlp" FORCE',
             'USE MODEL "gemma3-270m"', 'USE REMOTE "http://127.0.0.1:8080"', 'STATS "x.vindex"',
             'EXTRACT MODEL "m" INTO "o.vindex" FORCE', 'SELECT layer, token FROM FEATURES WHERE layer = 1 LIMIT 4',
             'DIFF "a.vindex" "b.vindex"', "COMPACT MAJOR", 'COMPILE CURRENT INTO MODEL "hf" DTYPE F32 FORCE',
             "SHOW SAES", "DROP SAES"]
    weights = ['INSERT INTO EDGES (entity, relation, target) VALUES ("A", "capital", "B")',
             'INSERT INTO EDGES (entity, relation, target) VALUES ("A", "capital", "B"), ("C", "capital", "D") '
             'METHOD MEMIT AT LAYER 1',
             'INSERT INTO EDGES (entity, relation, target) VALUES ("A", "capital", "B") METHOD MEMIT LAYERS 0-1',
             'INSERT INTO EDGES (entity, relation, target) VALUES ("A", "capital", "B") METHOD NEURON AT LAYER 1',
             'INSERT INTO EDGES (entity, relation, target) VALUES ("A", "capital", "B") METHOD NEURON',
             'INSERT INTO EDGES (entity, relation, target) VALUES ("A", "capital", "B") METHOD FEATURE CONFIDENCE 0.8',
             'CROWN "The capital of France is" FOR "Paris" SUBJECT "France"', "REBALANCE",
             "REBALANCE AT LAYER 2 UNTIL CONVERGED FLOOR 0.5 CEILING 0.99", "REBALANCE MAX 3",
             'INFER "The capital of France is"', 'INFER "x" TOP 3 COMPARE', 'TRACE "x"',
             'TRACE "x" FOR "Paris" LAYERS 0-2 POSITIONS ALL', 'TRACE "x" DECOMPOSE',
             'TRACE "x" POSITIONS ALL SAVE "t.trace" FORCE', 'EXPLAIN INFER "x"',
             'EXPLAIN INFER "x" LAYERS 1-2 VERBOSE TOP 4 WITH ATTENTION', 'EXPLAIN INFER "x" KNOWLEDGE RELATIONS ONLY',
             'INSERT INTO EDGES (entity, relation, target) VALUES ("A", "capital", "B") AT LAYER 2 METHOD ROME',
             'INSERT INTO EDGES (entity, relation, target, prompt) VALUES ("A", "capital", "B", "A is in") '
             'METHOD FEATURE', 'USE SAE "saes/l1" AT LAYER 1', 'USE SAE "saes/l1" LABELS "saes/l1.json"']
    with_weights = Session(vindex=edit_vindex(vxi))
    # an SAE attached: EXPLAIN INFER and DESCRIBE add its features, DROP SAE finds it by path or hook point
    sae = SAE("blocks.1.hook_resid_post", "standard", *(np.zeros(s, np.float32) for s in ((64, 8), (8, 64), 8, 64)))
    with_sae = Session(vindex=edit_vindex(vxi), saes={sae.hook_name: AttachedSae(sae, "saes/l1", 1)})
    sae_texts = ['EXPLAIN INFER "x" LAYERS 1-2', 'EXPLAIN INFER "x" TOP 2', 'DESCRIBE "France"',
                 'DESCRIBE "France" AT LAYER 1', 'DROP SAE "saes/l1"', 'DROP SAE "blocks.1.hook_resid_post"',
                 'INFER "x" TOP 3 STEER FEATURE 2 BY 40', 'FEATURES "The capital" TOP 2',
                 'FEATURES "x" AT LAYER 1 POSITIONS LAST', 'SAE FEATURE 3 TOP 5']
    got = "\n".join([plan(parse(t)[0], session).to_text() for t in texts]
                    + [plan(parse(t)[0], with_weights).to_text() for t in weights]
                    + [plan(parse(t)[0], with_sae).to_text() for t in sae_texts]) + "\n"
    path = Path(__file__).resolve().parents[2] / "golden" / "plans" / "plans.txt"
    if update_golden:
        path.parent.mkdir(exist_ok=True)
        path.write_text(got)
    assert got == path.read_text()


def test_every_statement_kind_has_a_golden_plan() -> None:
    """Each alternative of the grammar's `single` rule (USE's three forms apart) appears in plans.txt."""
    import re

    from larql.lql.parser import lark_parser

    grammar = (Path(__file__).resolve().parents[3] / "larql" / "lql" / "lql.lark").read_text()
    body = re.search(r"^\?single:(.*?)^\s*$", grammar, re.S | re.M)
    assert body is not None
    kinds = set(re.findall(r"[a-z_]+", body.group(1))) - {"use"} | {"use_vindex", "use_model", "use_remote"}
    golden = Path(__file__).resolve().parents[2] / "golden" / "plans" / "plans.txt"
    seen = set()
    for line in golden.read_text().splitlines():
        if line.startswith("PLAN "):
            tree = lark_parser().parse(line[5:])
            for sub in tree.children:
                seen |= {sub.data} if sub.data != "pipe" else {c.data for c in sub.children}
    assert kinds - seen == set(), f"statement kinds without a golden plan: {sorted(kinds - seen)}"
    assert len(kinds) == 39  # a new statement kind: add its golden plan above
