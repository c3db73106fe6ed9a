"""Run LQL: parse, plan, then dispatch each plan to its handler. Handlers fill in a Result."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from larql.errors import LarqlError, LqlError, LqlSemanticError
from larql.lql import ast
from larql.lql.ops import editing, inference, lifecycle, maintenance, query
from larql.lql.parser import parse
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
}


def run_statement(stmt: ast.Statement, session: Session) -> list[Result]:
    """Plan and run one statement (a pipe runs its stages in order and returns all their results)."""
    if session.remote is not None and not isinstance(stmt, ast.UseStmt):
        return _run_remote(stmt, session)
    p = plan(stmt, session)
    if isinstance(stmt, ast.PipeStmt):
        return [r for stage in stmt.stages for r in run_statement(stage, session)]
    result = Result(unparse(stmt))
    t0 = time.perf_counter()
    try:
        HANDLERS[type(stmt)](stmt, session, result)
    except LqlError:
        raise
    except OSError as e:  # a file the statement names cannot be read or written
        span = stmt.span
        raise LqlSemanticError(f"{_os_path(e)}: {e.strerror or e}", session.source, span.line, span.column,
                               "check the path: its directory must exist and be writable") from e
    except LarqlError as e:  # a vindex or model error while running: locate it at the statement
        span = stmt.span
        # the handlers do not report which step failed: name the plan, not a guess
        steps = " -> ".join(st.op for st in p.steps)
        raise LqlSemanticError(str(e), session.source, span.line, span.column,
                               f"while running the plan {steps}" if steps else "") from e
    result.elapsed_ms = (time.perf_counter() - t0) * 1e3
    return [result]


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
