"""The plan is what runs: every statement kind records the steps EXPLAIN / --plan shows, in order, and
a plan whose step parameters are changed runs differently (the handlers read them)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from larql.errors import LqlSemanticError
from larql.lql import ast
from larql.lql.executor import HANDLERS, execute, run_plan, run_statement
from larql.lql.parser import parse
from larql.lql.plan import Plan, Step
from larql.lql.planner import plan
from larql.lql.session import Session
from tests.sae_files import random_tensors, v6_cfg, write_sae


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Path]:
    """Run in a scratch directory (SHOW MODELS scans it; relative outputs land in it)."""
    old = Path.cwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(old)


def _script(vx: Path, vxi: Path) -> list[str]:
    """Every statement kind; DESCRIBE on the browse-level copy (its probes' prompts overflow the tiny
    model's 64-token context)."""
    row = '("zeta", "colour", "blue")'
    return [
        f'USE "{vx}"', 'DESCRIBE "abc" VERBOSE', 'DESCRIBE "abc" AT LAYER 1',
        f'USE "{vxi}"', "STATS", f'STATS "{vxi}"', "SHOW MODELS",
        'WALK "hello" TOP 2 LAYERS 1-2', 'EXPLAIN WALK "hello" VERBOSE',
        "SELECT * FROM EDGES WHERE layer = 1 AND score > 0 ORDER BY score DESC LIMIT 5",
        'SELECT feature FROM EDGES NEAREST TO "abc" AT LAYER 1 WHERE feature != 3 LIMIT 4',
        "SELECT * FROM ENTITIES LIMIT 3", "SHOW LAYERS 0-1", "SHOW FEATURES 2 LIMIT 4", "SHOW ENTITIES AT LAYER 1",
        "SHOW RELATIONS", 'INFER "The colour of zeta is" TOP 3', 'INFER "x" TOP 3 COMPARE',
        'EXPLAIN INFER "x" LAYERS 1-2 VERBOSE TOP 4 WITH ATTENTION', 'USE SAE "sae" AT LAYER 1', "SHOW SAES",
        'EXPLAIN INFER "x" LAYERS 1-2 WITH ATTENTION', 'FEATURES "x y" TOP 2', 'SAE FEATURE 1 TOP 2', 'DROP SAE "sae"', 'TRACE "x"',
        'TRACE "x" FOR "blue" LAYERS 0-2 POSITIONS ALL', 'TRACE "x" DECOMPOSE', 'TRACE "x" POSITIONS ALL SAVE "t.trace"',
        'CROWN "The colour of zeta is" FOR "blue" SUBJECT "zeta"', 'BEGIN PATCH "p.vlp"',
        f"INSERT INTO EDGES (entity, relation, target) VALUES {row} AT LAYER 2 METHOD FEATURE",
        'INSERT INTO EDGES (entity, relation, target, prompt) VALUES ("eta", "colour", "red", "Colour of eta") '
        "AT LAYER 1 METHOD ROME",
        'INSERT INTO EDGES (entity, relation, target, prompt) VALUES ("mu", "colour", "gold", "Colour of mu") '
        "AT LAYER 1 METHOD NEURON",
        "DELETE FROM EDGES WHERE layer = 1 AND feature = 2",
        "UPDATE EDGES SET confidence = 0.5 WHERE layer = 1 AND feature = 3", "SHOW PATCHES", "SAVE PATCH",
        'REMOVE PATCH "p.vlp"', 'APPLY PATCH "p.vlp"', "SHOW COMPACT STATUS", "COMPACT MAJOR",
        "REBALANCE AT LAYER 2 MAX 1", 'MERGE "p.vlp" ON CONFLICT KEEP_CURRENT',
        'COMPILE CURRENT INTO VINDEX "c.vindex"', 'COMPILE CURRENT INTO MODEL "c.gguf" FORMAT GGUF',
        f'DIFF "{vxi}" "c.vindex" LIMIT 3 INTO PATCH "d.vlp"', 'DIFF "c.vindex" CURRENT LAYER 2',
        f'EXTRACT MODEL "{vxi.parent / "m.gguf"}" INTO "e.vindex"', 'WALK "a" |> SHOW LAYERS 0-1',
        f'USE MODEL "{vxi}"', 'INFER "x" TOP 2']


def test_every_statement_kind_runs_its_explained_steps(vx: Path, vxi: Path, here: Path) -> None:
    write_sae(here / "sae", random_tensors(64, 16, seed=1), v6_cfg(64, 16, hook="blocks.1.hook_resid_post"))
    session = Session()
    kinds: set[type] = set()
    for text in _script(vx, vxi):
        session.source = text
        for stmt in parse(text):
            stages = stmt.stages if isinstance(stmt, ast.PipeStmt) else (stmt,)
            planned = [[s.line() for s in plan(st, session).steps] for st in stages]
            results = run_statement(stmt, session)
            assert [r.steps for r in results] == planned, text
            kinds |= {type(st) for st in stages} | {type(stmt)}
    # USE REMOTE's plan runs on the server (tests/serve); every other kind ran here
    assert set(HANDLERS) | {ast.PipeStmt} == kinds


def _plan(session: Session, text: str) -> Plan:
    session.source = text
    (stmt,) = parse(text)
    return plan(stmt, session)


@pytest.fixture
def s(vxi: Path) -> Session:
    session = Session()
    execute(f'USE "{vxi}"', session)
    return session


def test_walk_infer_select_read_their_parameters(s: Session) -> None:
    p = _plan(s, 'WALK "hello" TOP 2 LAYERS 1-2')
    (as_planned,) = run_plan(p, s)
    (changed,) = run_plan(p.with_params("gate_knn", top=5, layers=(0, 0)), s)
    assert len(as_planned.rows) == 4 and {r[0] for r in as_planned.rows} == {1, 2}
    assert len(changed.rows) == 5 and {r[0] for r in changed.rows} == {0}

    p = _plan(s, 'INFER "The colour of zeta is" TOP 3')
    assert len(run_plan(p, s)[0].rows) == 3 and len(run_plan(p.with_params("top_k", k=7), s)[0].rows) == 7

    p = _plan(s, "SELECT * FROM EDGES WHERE layer = 1 ORDER BY score DESC LIMIT 5")
    (desc,) = run_plan(p, s)
    (asc,) = run_plan(p.with_params("order", descending=False).with_params("limit", n=2), s)
    assert len(asc.rows) == 2 and asc.rows[0][-1] < desc.rows[0][-1]
    (other,) = run_plan(p.with_params("filter", where=(ast.Condition("layer", "=", 3),)), s)
    assert {r[0] for r in other.rows} == {3}


def test_infer_forward_step_chooses_the_ffn(s: Session) -> None:
    execute('INSERT INTO EDGES (entity, relation, target) VALUES ("zeta", "colour", "blue") AT LAYER 2 '
            "METHOD FEATURE", s)
    p = _plan(s, 'INFER "The colour of zeta is" TOP 5')
    assert p.steps[1].params["ffn"] == "walk"
    (walk,) = run_plan(p, s)
    (dense,) = run_plan(p.with_params("forward", ffn="dense"), s)
    model = s.vindex.model()  # type: ignore[union-attr]
    ids = model.tokenize("The colour of zeta is")
    expect = model.dense().next_logits(ids)
    assert walk.rows != dense.rows  # the inserted feature moves the walk FFN's answer only
    assert [r[3] for r in dense.rows] == pytest.approx(np.sort(expect)[::-1][:5].tolist(), abs=1e-5)


def test_describe_trace_insert_and_compile_read_their_parameters(s: Session, vx: Path, tmp_path: Path) -> None:
    browse = Session()
    execute(f'USE "{vx}"', browse)
    p = _plan(browse, 'DESCRIBE "abc" VERBOSE')
    (brief,) = run_plan(p.with_params("collect_edges", mode="brief", min_gate=-1e9), browse)
    assert brief.columns == ["section", "relation", "target", "score", "layers"]  # VERBOSE's adds "also"
    with pytest.raises(LqlSemanticError, match="layer 9"):
        run_plan(p.with_params("gate_knn", layers=[9]), browse)

    p = _plan(s, 'TRACE "x"')
    (full,) = run_plan(p, s)
    (part,) = run_plan(p.with_params("run_with_cache", layers=(1, 2)), s)
    assert [r[0] for r in full.rows] == ["emb", "L0", "L1", "L2", "L3"] and [r[0] for r in part.rows] == ["emb", "L1", "L2"]

    p = _plan(s, 'INSERT INTO EDGES (entity, relation, target) VALUES ("zeta", "colour", "blue") AT LAYER 2 '
                 "METHOD FEATURE")
    (ins,) = run_plan(p.with_params("capture", layer=1), s)
    assert ins.title.startswith("Inserted zeta -[colour]-> blue at L1 F")
    other = {"entity": "eta", "relation": "size", "target": "red"}
    (ins,) = run_plan(p.with_params("capture", facts=(other,)), s)
    assert ins.title.startswith("Inserted eta -[size]-> red at L2 F")

    p = _plan(s, f'COMPILE CURRENT INTO VINDEX "{tmp_path / "a.vindex"}"')
    run_plan(p.with_params("bake_overlay", into=str(tmp_path / "b.vindex")), s)
    assert (tmp_path / "b.vindex" / "index.json").is_file() and not (tmp_path / "a.vindex").exists()


def test_a_plan_and_a_handler_that_disagree_fail_naming_the_step(s: Session) -> None:
    p = _plan(s, 'INFER "x" TOP 2')
    extra = dataclasses.replace(p, steps=(*p.steps, Step("compare_dense")))
    assert len(run_plan(extra, s)[0].columns) == 5  # an optional step the plan adds runs
    bogus = dataclasses.replace(p, steps=(*p.steps, Step("gate_knn", "layers all")))
    with pytest.raises(LqlSemanticError, match="without running step.*gate_knn") as e:
        run_plan(bogus, s)
    assert "failed at step 3 of 4: top_k  2" in e.value.hint
    missing = dataclasses.replace(p, steps=p.steps[1:])
    with pytest.raises(LqlSemanticError, match="ran step 'tokenize' where the plan has 'forward'"):
        run_plan(missing, s)


def test_a_failure_names_the_step_that_was_running(s: Session) -> None:
    with pytest.raises(LqlSemanticError) as e:
        execute('DIFF "/nonexistent.vindex" CURRENT', s)
    assert e.value.message == "/nonexistent.vindex: no such vindex directory"
    assert e.value.hint.startswith("failed at step 1 of 2: compare_features  /nonexistent.vindex vs CURRENT")
    with pytest.raises(LqlSemanticError) as e:
        execute('INFER "" TOP 2', s)
    assert e.value.hint.startswith("failed at step 2 of 3: forward  walk FFN")
