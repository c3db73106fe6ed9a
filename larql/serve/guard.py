"""What a request may do, decided before anything runs: which statements write, whether this
client may write, and that every path a statement names stays under the server's working directory.

A request is checked whole first (every statement), so a refused request changes nothing.
"""

from __future__ import annotations

import hmac
from dataclasses import replace
from pathlib import Path

from larql.errors import AccessError, LqlSemanticError
from larql.lql import ast

# statements that change state: the session's overlay, its patch stack, or files on the server
WRITES: tuple[type, ...] = (
    ast.InsertStmt, ast.DeleteStmt, ast.UpdateStmt, ast.BeginPatchStmt, ast.SavePatchStmt, ast.ApplyPatchStmt,
    ast.RemovePatchStmt, ast.CompileStmt, ast.ExtractStmt, ast.MergeStmt, ast.RebalanceStmt, ast.CompactStmt,
)
# statements that would point the session at another vindex or model: a server serves one; and USE SAE,
# whose SAE a request's session would forget when the request ends
ELSEWHERE: tuple[type, ...] = (ast.UseStmt, ast.ExtractStmt, ast.UseSaeStmt)


def stages(stmt: ast.Statement) -> list[ast.Statement]:
    """The statements a statement runs (a pipe's stages, else itself)."""
    return [s for st in stmt.stages for s in stages(st)] if isinstance(stmt, ast.PipeStmt) else [stmt]


def writes(stmt: ast.Statement) -> bool:
    """Whether the statement changes anything (TRACE ... SAVE and DIFF ... INTO PATCH write a file)."""
    return any(isinstance(s, WRITES) or (isinstance(s, ast.TraceStmt) and s.save is not None)
               or (isinstance(s, ast.DiffStmt) and s.into_patch is not None) for s in stages(stmt))


# the fields of each statement that name a file (REMOVE PATCH names a patch on the stack, not a file)
PATH_FIELDS: dict[type, tuple[str, ...]] = {
    ast.BeginPatchStmt: ("path",), ast.ApplyPatchStmt: ("path",), ast.CompileStmt: ("source", "into"),
    ast.StatsStmt: ("path",), ast.TraceStmt: ("save",), ast.DiffStmt: ("a", "b", "into_patch"),
    ast.MergeStmt: ("source", "into"),
}


def _located(stmt: ast.Statement, source: str, message: str, hint: str) -> LqlSemanticError:
    return LqlSemanticError(message, source, stmt.span.line, stmt.span.column, hint)


def anchor(stmt: ast.Statement, root: Path, source: str) -> ast.Statement:
    """The statement with every path it names made absolute under `root` (the server's directory,
    whatever the process's working directory is); a path that resolves outside it, symbolic links
    followed, is refused."""
    if isinstance(stmt, ast.PipeStmt):
        return replace(stmt, stages=tuple(anchor(s, root, source) for s in stmt.stages))
    base = root.resolve()
    changes: dict[str, str] = {}
    for name in PATH_FIELDS.get(type(stmt), ()):
        p = getattr(stmt, name)
        if p is None:
            continue
        resolved = (base / p).resolve()
        if resolved != base and base not in resolved.parents:
            raise _located(stmt, source, f"{p}: outside the server's directory {base}",
                           "name a path under the directory `larql serve` was started in")
        changes[name] = str(base / p)  # unresolved: a patch keeps the name it was given
    return replace(stmt, **changes) if changes else stmt


def check_request(statements: list[ast.Statement], source: str, *, root: Path, allow_edits: bool,
                  token: str | None, bearer: str | None) -> tuple[list[ast.Statement], bool]:
    """Check every statement of a request before any runs: the statements to run (paths anchored
    under `root`) and whether the request writes.

    Raises AccessError (403 read-only, 401 token) or an LqlSemanticError at the statement at fault.
    """
    any_write = False
    anchored = []
    for stmt in statements:
        for s in stages(stmt):
            if isinstance(s, ast.UseSaeStmt):
                raise _located(s, source, "USE SAE is not available on a server: each request runs in a new "
                               "session, which would not keep the SAE", "run USE SAE in a local larql")
            if isinstance(s, ELSEWHERE):
                kind = "USE" if isinstance(s, ast.UseStmt) else "EXTRACT"
                raise _located(s, source, f"{kind} is not available on a server: it serves one vindex or model",
                               "send the other statements; run USE and EXTRACT in a local larql")
        anchored.append(anchor(stmt, root, source))
        any_write = any_write or writes(stmt)
    if any_write:
        if not allow_edits:
            raise AccessError("this server is read-only: INSERT, DELETE, UPDATE, the patch statements and "
                              "COMPILE need a server started with --allow-edits", status=403)
        if token is not None and not (bearer is not None and hmac.compare_digest(bearer.encode(), token.encode())):
            raise AccessError("this statement writes and the server has a token: send the header "
                              "'Authorization: Bearer <token>'" if bearer is None else
                              "wrong token in 'Authorization: Bearer ...'", status=401)
    return anchored, any_write
