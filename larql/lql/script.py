"""Running LQL text statement by statement, for a shell that shows each result as it comes (the
`larql lql` command and the editing commands built on it).

Parsing loads no numba; the runtime (lql/executor.py) is imported only once the whole text has
parsed, so a syntax error is reported without loading it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from larql.lql.parser import parse
from larql.lql.result import Result
from larql.lql.session import Session
from larql.lql.unparse import unparse

Around = Callable[[str], AbstractContextManager[Any]]


def run_text(text: str, session: Session, sink: Callable[[Result], None], around: Around | None = None) -> None:
    """Parse `text`, then run its statements in order, handing each result to `sink`.

    Args:
        text: one or more LQL statements separated by ';' (the session's source, for error carets).
        session: what the statements share (the vindex in use); USE changes it for the ones after.
        sink: called with each result once its statement has run.
        around: a context manager entered around each statement's run, given its canonical text (a
            progress display); it is left before that statement's results go to `sink`.

    Example:
        >>> run_text('USE "g.vindex"; STATS;', Session(), print)
    """
    session.source = text
    statements = parse(text)
    from larql.lql.executor import run_statement

    for stmt in statements:
        with around(unparse(stmt)) if around is not None else nullcontext():
            results = run_statement(stmt, session)
        for result in results:
            sink(result)
