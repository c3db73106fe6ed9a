"""Run LQL: parse, plan, then run the plan: its handler (by statement kind) takes the plan's steps
in order and reads each step's parameters (lql/plan.py), filling in a Result. A step the handler
skips or invents is an error, and a failure is blamed on the step that was running."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from larql.errors import LarqlError, LqlError, LqlSemanticError
from larql.lql import ast
from larql.lql.ops import editing, inference, lifecycle, maintenance, query, sae
from larql.lql.parser import parse
from larql.lql.plan import Plan, PlanRun
from larql.lql.planner import plan
from larql.lql.result import Result
from larql.lql.session import Session
from larql.lql.unparse import unparse

HANDLERS: dict[type, Callable[..., None]] = {
    ast.UseStmt: lifecycle.use, ast.ExtractStmt: lifecycle.extract_stmt, ast.StatsStmt: lifecycle.stats,
    ast.ShowModelsStmt: lifecycle.show_models, ast.DescribeStmt: query.describe, ast.WalkStmt: query.walk,
    ast.ExplainWalkStmt: query.explain_walk, ast.SelectStmt: query.select, ast.ShowLayersStmt: query.show_layers,
    ast.ShowFeaturesStmt: query.show_features, ast.ShowEntitiesStmt: query.show_entities,
    ast.ShowRelationsStmt: query.show_relations, ast.InferStmt: inference.infer, ast.TraceStmt: inference.trace,
    ast.CrownStmt: inference.crown,
    ast.ExplainInferStmt: inference.explain_infer, ast.InsertStmt: editing.insert, ast.DeleteStmt: editing.delete,
    ast.UpdateStmt: editing.update, ast.BeginPatchStmt: editing.begin_patch, ast.SavePatchStmt: editing.save_patch,
    ast.ApplyPatchStmt: editing.apply_patch, ast.RemovePatchStmt: editing.remove_patch,
    ast.ShowPatchesStmt: editing.show_patches, ast.CompileStmt: editing.compile_stmt, ast.DiffStmt: lifecycle.diff_stmt,
    ast.MergeStmt: maintenance.merge_stmt, ast.RebalanceStmt: maintenance.rebalance_stmt,
    ast.CompactStmt: maintenance.compact_stmt, ast.ShowCompactStatusStmt: maintenance.show_compact_status,
    ast.UseSaeStmt: sae.use_sae, ast.ShowSaesStmt: sae.show_saes, ast.DropSaeStmt: sae.drop_sae,
    ast.SaeFeaturesStmt: sae.sae_features, ast.SaeFeatureStmt: sae.sae_feature,
}


def run_statement(stmt: ast.Statement, session: Session) -> list[Result]:
    """Plan and run one statement (a pipe runs its stages in order and returns all their results)."""
    if session.remote is not None and not isinstance(stmt, ast.UseStmt):
        return _run_remote(stmt, session)
    return run_plan(plan(stmt, session), session)


def run_plan(p: Plan, session: Session) -> list[Result]:
    """Run a plan: what runs is what its steps say (a plan with a changed parameter runs differently).

    Each result records the steps taken (`Result.steps`), which are the plan's, in order."""
    stmt = p.statement
    run = PlanRun(p)
    if isinstance(stmt, ast.PipeStmt):  # each stage is planned when its turn comes (after the ones before ran)
        return [r for _ in p.steps for r in run_statement(run.take("run")["statement"], session)]
    result = Result(unparse(stmt))
    t0 = time.perf_counter()
    try:
        HANDLERS[type(stmt)](stmt, session, result, run)
        run.take_if("replace_existing")  # FORCE qualifies the handler's write, which read it (PlanRun.peek)
        run.finish()
    except LqlError:
        raise
    except OSError as e:  # a file the statement names cannot be read or written
        span = stmt.span
        raise LqlSemanticError(f"{_os_path(e)}: {e.strerror or e}", session.source, span.line, span.column,
                               "check the path: its directory must exist and be writable" + _at(run)) from e
    except LarqlError as e:  # a vindex or model error while running: locate it at the statement and the step
        span = stmt.span
        raise LqlSemanticError(str(e), session.source, span.line, span.column, _at(run).lstrip("; ")) from e
    result.elapsed_ms = (time.perf_counter() - t0) * 1e3
    result.steps = [s.line() for s in run.taken]
    return [result]


def _at(run: PlanRun) -> str:
    """Where in the plan a failure happened: the step that was running."""
    step = run.current
    if step is None:
        return ""
    i = len(run.taken)
    return f"; failed at step {i} of {len(run.plan.steps)}: {step.line()}"


def _run_remote(stmt: ast.Statement, session: Session) -> list[Result]:
    """After USE REMOTE: the server plans and runs the statement; its errors arrive located here."""
    try:
        return session.remote.run(stmt, session.source)
    except LqlError:
        raise
    except LarqlError as e:  # the server cannot be reached, or is not a larql server
        raise LqlSemanticError(str(e), session.source, stmt.span.line, stmt.span.column) from e


def _os_path(e: OSError) -> str:
    """The path an OSError is about, as the user wrote it (not larql's temporary .NAME.tmp-PID)."""
    name = e.filename2 or e.filename
    if name is None:
        return "a file"
    p = Path(str(name))
    return str(p.with_name(re.sub(r"^\.(.+)\.tmp-\d+$", r"\1", p.name))) if p.name else str(p)


def execute(text: str, session: Session | None = None) -> list[Result]:
    """Parse and run LQL text; stops at the first error (raised as an LqlError)."""
    session = session or Session()
    session.source = text
    out: list[Result] = []
    for stmt in parse(text):
        out += run_statement(stmt, session)
    return out
