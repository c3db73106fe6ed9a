"""LQL: grammar -> AST -> plan -> execute.

    lql.lark        the grammar (the only definition of LQL syntax)
    parser.py       text -> statements (Lark, then transformer.py into ast.py's dataclasses)
    unparse.py      statements -> canonical text; complete.py: completion for the shells
    planner.py      a statement -> a Plan of steps (plan.py, plan_maintenance.py, plan_sae.py), checked
                    against the session
    executor.py     runs a plan through the handlers in ops/, one module per statement family
    script.py       run_text: a text's statements in order, each result to a sink as it comes
    result.py       the Result value; formats.py its HTML, CSV and Markdown forms
    session.py      what a run of statements shares; remote.py: USE REMOTE; paths.py, clauses.py,
                    reference.py: what statements may write, shared clauses, the statement reference
"""

from __future__ import annotations

from larql.lql.ast import Statement
from larql.lql.parser import parse, parse_one
from larql.lql.unparse import unparse

__all__ = ["Statement", "parse", "parse_one", "unparse"]
