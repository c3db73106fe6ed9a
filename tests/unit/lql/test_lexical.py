"""LQL's lexical rules (vindex_spec/LQL.md): string escapes, number ranges, length limits, and
inputs that used to crash or crawl. Every bad input is an LqlSyntaxError at the right column."""

from __future__ import annotations

import time

import pytest

from larql.errors import LqlSyntaxError
from larql.lql import parse, parse_one, unparse
from larql.lql.parser import MAX_SOURCE, MAX_TOKENS
from larql.lql.transformer import MAX_NAME, MAX_PATH, MAX_STRING


@pytest.mark.parametrize("literal, value", [
    (r'"a\nb\tc\rd"', "a\nb\tc\rd"), (r'"\"q\" \\ \/ \'"', "\"q\" \\ / '"), (r"'It\'s \"x\"'", "It's \"x\""),
    (r'"\u00e9\u2603"', "é☃"), (r'"\ud83d\ude00"', "😀"), (r'"\b\f"', "\b\f"), ('"é ☃ 😀"', "é ☃ 😀"),
    (r'"x\\"', "x\\"), ('""', ""),
])
def test_escapes(literal: str, value: str) -> None:
    stmt = parse_one(f"DESCRIBE {literal}")
    assert stmt.entity == value  # type: ignore[attr-defined]
    assert parse_one(unparse(stmt)) == stmt  # unparse writes JSON escapes, which read back


@pytest.mark.parametrize("source, column, says", [
    (r'DESCRIBE "\N{NOPE}"', 11, r"unknown escape \N"), (r'DESCRIBE "ab\x41"', 13, r"unknown escape \x"),
    (r'DESCRIBE "\0"', 11, r"unknown escape \0"), (r'DESCRIBE "\U0001F600"', 11, r"unknown escape \U"),
    (r'DESCRIBE "\u12"', 11, r"\u needs exactly 4 hex digits"), (r'DESCRIBE "\u0000"', 11, "a NUL character"),
    (r'DESCRIBE "\ud800"', 11, "a lone surrogate"), (r'DESCRIBE "\ude00\ud83d"', 11, "a lone surrogate"),
    (r'DESCRIBE "ok\n\ud83dx"', 15, "a lone surrogate"),
    ('DESCRIBE "a\x00b"', 12, "a NUL character is not allowed"), ('DESCRIBE "\ud800"', 11, "a lone surrogate (U+D800)"),
    ('WALK "x"\n\x00', 1, "a NUL character"),
])
def test_bad_escapes_and_characters(source: str, column: int, says: str) -> None:
    with pytest.raises(LqlSyntaxError) as info:
        parse(source)
    assert says in info.value.message and info.value.column == column


@pytest.mark.parametrize("source, says", [
    ("WALK 'x' TOP " + "9" * 5000, "out of range"), ("WALK 'x' TOP 2147483648", "out of range"),
    ("SHOW LAYERS 0-99999999999999999999", "out of range"),
    ("SELECT * FROM EDGES WHERE score = " + "9" * 17, "out of range"),
    ("SELECT * FROM EDGES WHERE score = -" + "9" * 400 + ".5", "too long"),
    ("SELECT * FROM EDGES WHERE " + "a" * (MAX_NAME + 1) + " = 1", "field name"),
    ('DESCRIBE "' + "x" * (MAX_STRING + 1) + '"', "too long"),
    ('USE "' + "d/" * (MAX_PATH // 2) + 'x"', "path of"), ('USE "' + "x" * 300 + '"', "longer than 240 bytes"),
    ('USE "' + "\\\\" * 241 + '"', "longer than 240 bytes"),  # a backslash is no separator on POSIX
    ('BEGIN PATCH ""', "an empty path"), ('APPLY PATCH "dir/"', "names a directory"),
    ("STATS;" * (MAX_TOKENS // 2 + 1), "tokens"), (" " * (MAX_SOURCE + 1), "characters"),
])
def test_limits(source: str, says: str) -> None:
    with pytest.raises(LqlSyntaxError) as info:
        parse(source)
    assert says in info.value.message
    assert len(str(info.value).splitlines()[2]) < 200  # a long line is shown around the column only


def test_numbers_at_the_limits_parse() -> None:
    assert parse_one("WALK 'x' TOP 2147483647").top == 2**31 - 1  # type: ignore[attr-defined]
    (cond,) = parse_one(f"SELECT * FROM EDGES WHERE score = -{2**53 - 1}").where  # type: ignore[attr-defined]
    assert cond.value == -(2**53 - 1)


@pytest.mark.parametrize("source", [
    "'" * 5001, "'" * 5000 + "USE g.vindex", '"' * 4999, "\\" * 10_000, "(" * 100_000, "-1" * 50_000,
    "--x\n" * 60_000, 'DESCRIBE "' + "x" * 200_000, 'DESCRIBE "' + "\\'" * 100_000,
    " " * 200_000 + "(", "SELECT * FROM EDGES WHERE layer IN (" + "1," * 100_000 + "1)",
    ";".join('WALK "' + "\\u0041" * 10_000 + '"' for _ in range(4)),
])
def test_pathological_inputs_fail_fast(source: str) -> None:
    t0 = time.perf_counter()
    try:
        parse(source)
    except LqlSyntaxError:
        pass
    assert time.perf_counter() - t0 < 0.5  # ~10-60 ms here; the bound is loose for loaded machines
