"""The grammar: every statement shape parses to its AST and back (golden canonical forms),
malformed statements fail with golden messages and carets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from lark import Lark

from larql.errors import LqlSyntaxError
from larql.lql import ast, parse, unparse
from larql.lql.parser import GRAMMAR

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "lql"


def fixture_statements() -> list[str]:
    text = (GOLDEN / "statements.lql").read_text()
    return [line.rstrip().rstrip(";") for line in text.splitlines() if line.strip() and not line.startswith("--")]


def test_grammar_builds_in_strict_lalr_mode() -> None:
    Lark(GRAMMAR.read_text(), parser="lalr", strict=True)


def test_canonical_forms_and_round_trip(update_golden: bool) -> None:
    lines = fixture_statements()
    canonical = []
    for line in lines:
        (stmt,) = parse(line)
        text = unparse(stmt)
        assert parse(text) == [stmt], line  # parse(unparse(s)) == s
        assert unparse(parse(text)[0]) == text  # canonical is a fixed point
        canonical.append(text)
    path = GOLDEN / "statements.canonical"
    if update_golden:
        path.write_text("\n".join(canonical) + "\n")
    assert canonical == path.read_text().splitlines()


def test_every_statement_kind_is_covered() -> None:
    kinds = {type(s) for line in fixture_statements() for s in parse(line)}
    kinds |= {type(x) for line in fixture_statements() for s in parse(line) if isinstance(s, ast.PipeStmt) for x in s.stages}
    every = {c for c in vars(ast).values() if isinstance(c, type) and issubclass(c, ast.Statement) and c is not ast.Statement}
    assert every - kinds == set()
    assert len(every) >= 30


def test_ast_values() -> None:
    (s,) = parse("select entity, target from EDGES where layer in (1, 2) and score >= -0.5 order by score desc limit 7")
    assert s == ast.SelectStmt(("entity", "target"), "edges", None,
                               (ast.Condition("layer", "IN", (1, 2)), ast.Condition("score", ">=", -0.5)),
                               ast.OrderBy("score", True), 7)
    (w,) = parse("WALK 'x' LAYERS 2-4")
    assert w.layers == ast.Range(2, 4) and w.span.line == 1 and w.span.column == 1
    stmts = parse('-- comment\nUSE "a.vindex";;\n  DESCRIBE "France" ; STATS')
    assert [type(x) for x in stmts] == [ast.UseStmt, ast.DescribeStmt, ast.StatsStmt]
    assert stmts[1].span.line == 3 and stmts[1].span.column == 3
    assert parse("") == [] and parse(";;") == []
    assert dataclasses.replace(w, span=ast.NO_SPAN) == w  # spans do not take part in equality


def error_cases() -> list[tuple[str, str]]:
    blocks = (GOLDEN / "errors.txt").read_text().split("\n=====\n")
    return [tuple(b.split("\n-----\n")) for b in blocks if b.strip()]  # type: ignore[misc]


@pytest.mark.parametrize("source, expected", error_cases())
def test_error_messages(source: str, expected: str) -> None:
    with pytest.raises(LqlSyntaxError) as info:
        parse(source)
    assert str(info.value) == expected.rstrip("\n")
    assert info.value.line >= 1 and info.value.column >= 1
