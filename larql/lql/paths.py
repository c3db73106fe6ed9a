"""Where a statement may write, checked at plan time (before anything runs).

A statement never writes into, over, or around (a directory holding) what it reads: the vindex in
use, a vindex it names (COMPILE "a.vindex", DIFF "a" "b"), the model EXTRACT reads, or the model a
vindex was extracted from (`larql verify --repair` and FORMAT GGUF read it again). FORCE does not
change that. An existing output is replaced only with FORCE (EXTRACT into a vindex of the same
source and options reuses it, as before). Paths are compared as the file system sees them:
symbolic links and '..' resolved, and by device and inode, so another name for the same directory
is the same directory. The writers check an existing output again when they write (no clobbering
by a file that appeared meanwhile).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from larql.errors import LarqlError, LqlSemanticError
from larql.io.pathguard import overlap, relation  # noqa: F401  (relation: what the tests and serve read)
from larql.lql import ast
from larql.lql.unparse import unparse

if TYPE_CHECKING:
    from larql.lql.session import Session


def output(stmt: ast.Statement, session: Session) -> tuple[str, bool] | None:
    """The path a statement writes (and whether it says FORCE), or None if it writes no file."""
    if isinstance(stmt, (ast.ExtractStmt, ast.CompileStmt)):
        return stmt.into, stmt.force
    if isinstance(stmt, ast.DiffStmt) and stmt.into_patch is not None:
        return stmt.into_patch, stmt.force
    if isinstance(stmt, ast.TraceStmt) and stmt.save is not None:
        return stmt.save, stmt.force
    if isinstance(stmt, ast.BeginPatchStmt):
        return stmt.path, stmt.force
    if isinstance(stmt, ast.SavePatchStmt):
        stack = getattr(session.vindex, "patches", None)
        if stack is None or stack.recording is None:
            return None  # SAVE PATCH says what is missing when it runs
        return str(stack.recording), stmt.force or stack.force
    return None


def _source_model(vindex: Path, index: dict[str, Any] | None = None) -> Path | None:
    """The model file or directory a vindex was extracted from, as its index.json records it."""
    try:
        if index is None:
            from larql.io.jsonfile import read_json  # here: it loads numpy, which planning must not

            index = read_json(vindex / "index.json", 16 << 20, 64, "vindex index")
        src = index.get("source", {}).get("path") if isinstance(index, dict) else None
        return Path(src) if isinstance(src, str) and src else None
    except (LarqlError, OSError, AttributeError):
        return None


def guarded(stmt: ast.Statement, session: Session) -> list[tuple[Path, str]]:
    """(path, what it is) of everything the statement reads and so must not write."""
    out: list[tuple[Path, str]] = []
    v = session.vindex
    if v is not None:
        out.append((Path(v.path), "the vindex in use"))
        src = _source_model(Path(v.path), getattr(v, "index", None))
        if src is not None:
            out.append((src, f"the model {v.path} was extracted from"))
    model_path = getattr(session.model, "path", None)
    if isinstance(model_path, (str, Path)):
        out.append((Path(model_path), "the model in use"))
    named: list[str | None] = []
    if isinstance(stmt, ast.CompileStmt):
        named = [stmt.source]
    elif isinstance(stmt, ast.DiffStmt):
        named = [stmt.a, stmt.b]
    elif isinstance(stmt, ast.MergeStmt):
        named = [stmt.source]
    what = "the source this statement merges" if isinstance(stmt, ast.MergeStmt) else "a vindex this statement reads"
    for p in named:
        if p is not None:
            out.append((Path(p), what))
            src = _source_model(Path(p))
            if src is not None:
                out.append((src, f"the model {p} was extracted from"))
    if isinstance(stmt, ast.ExtractStmt) and Path(stmt.model).expanduser().exists():
        out.append((Path(stmt.model).expanduser(), "the model this statement reads"))
    return out


def check(stmt: ast.Statement, session: Session) -> None:
    """Refuse (LqlSemanticError at the statement) a write into/over/around what it reads, or over an
    existing output without FORCE."""
    out = output(stmt, session)
    if out is None:
        return
    path, force = out
    target = Path(path)
    span = stmt.span
    message = overlap(path, guarded(stmt, session))
    if message is not None:
        raise LqlSemanticError(message, session.source, span.line, span.column,
                               "write the output somewhere else (edits of a vindex go to patches, FORCE or not)")
    if force or not os.path.lexists(target):
        return
    if isinstance(stmt, ast.ExtractStmt) and (target / "index.json").is_file():
        return  # the same extraction is reused, another one refused, when it runs
    forced = "SAVE PATCH FORCE" if isinstance(stmt, ast.SavePatchStmt) else unparse(replace(stmt, force=True))
    raise LqlSemanticError(f"{path}: already exists; add FORCE to replace it, or choose another path",
                           session.source, span.line, span.column, f"e.g. {forced[:200]}")
