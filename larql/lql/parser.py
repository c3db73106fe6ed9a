"""parse(text) -> list[Statement]: Lark LALR over grammar/lql.lark, errors as LqlSyntaxError."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import lark
from lark import Lark, Token
from lark.exceptions import (
    LarkError,
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from larql.errors import LqlError, LqlSyntaxError
from larql.lql import ast
from larql.lql.transformer import BAD_CHARS, ToAst

# input-wide limits (vindex_spec/LQL.md "Limits"); per-literal ones are in transformer.py
MAX_SOURCE = 262_144  # characters of one input (a script, a REPL entry)
MAX_TOKENS = 2_048  # tokens of one input (~250 statements): at 10-40 us a token, parsing stays under 100 ms

GRAMMAR = Path(__file__).with_name("lql.lark")  # a link to grammar/lql.lark, shipped as package data

# One worked example per statement keyword, quoted in syntax errors.
EXAMPLES = {
    "EXTRACT": 'EXTRACT MODEL "gemma3-270m" INTO "g.vindex" WITH INFERENCE',
    "COMPILE": 'COMPILE CURRENT INTO VINDEX "edited.vindex"',
    "DIFF": 'DIFF "a.vindex" CURRENT LIMIT 20',
    "USE": 'USE "g.vindex"',
    "WALK": 'WALK "The capital of France is" TOP 5',
    "DESCRIBE": 'DESCRIBE "France"',
    "SELECT": 'SELECT * FROM EDGES WHERE entity = "France" LIMIT 10',
    "EXPLAIN": 'EXPLAIN WALK "The capital of France is"',
    "INFER": 'INFER "The capital of France is" TOP 3',
    "TRACE": 'TRACE "The capital of France is" FOR "Paris"',
    "CROWN": 'CROWN "The capital of France is" FOR "Paris" SUBJECT "France"',
    "INSERT": 'INSERT INTO EDGES (entity, relation, target) VALUES ("Atlantis", "capital", "Poseidon")',
    "DELETE": 'DELETE FROM EDGES WHERE layer = 12 AND feature = 7',
    "UPDATE": 'UPDATE EDGES SET target = "Lyon" WHERE entity = "France"',
    "MERGE": 'MERGE "theirs.vlp" ON CONFLICT KEEP_CURRENT',
    "REBALANCE": "REBALANCE AT LAYER 12",
    "COMPACT": "COMPACT MAJOR",
    "BEGIN": 'BEGIN PATCH "edits.vlp"',
    "APPLY": 'APPLY PATCH "edits.vlp"',
    "REMOVE": 'REMOVE PATCH "edits.vlp"',
    "SHOW": "SHOW LAYERS",
    "STATS": "STATS",
}

_WORDS = {"STRING": "a quoted string", "INT": "a whole number", "FLOAT": "a number", "NAME": "a field name",
          "SEMICOLON": "';'", "LPAR": "'('", "RPAR": "')'", "COMMA": "','", "MINUS": "'-'", "EQUAL": "'='",
          "STAR": "'*'", "$END": "the end of the statement", "__ANON_0": "'|>'"}


class _TooManyTokens(LarkError):
    def __init__(self, token: Token) -> None:
        super().__init__(f"more than {MAX_TOKENS} tokens")
        self.token = token


class _TokenLimit:
    """A Lark post-lexer that stops an input at its MAX_TOKENS+1st token."""

    always_accept: tuple[str, ...] = ()

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        for n, tok in enumerate(stream):
            if n == MAX_TOKENS:
                raise _TooManyTokens(tok)
            yield tok


def _cache_file(grammar: str) -> str | bool:
    """Where Lark keeps the built parser: $LARQL_CACHE (default ~/.cache/larql), a private directory,
    one file per grammar version; False (no cache) if it cannot be made. Lark checks a hash of the
    grammar, its options and its version before it loads the file, and rebuilds on any mismatch."""
    root = Path(os.environ.get("LARQL_CACHE", Path.home() / ".cache" / "larql"))
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return False
    key = hashlib.sha256(f"{grammar}{lark.__version__}{sys.version_info[:2]}".encode()).hexdigest()[:16]
    return str(root / f"lql-grammar-{key}.lark")


@lru_cache(maxsize=1)
def _lark() -> Lark:
    grammar = GRAMMAR.read_text()
    return Lark(grammar, parser="lalr", strict=True, propagate_positions=True, maybe_placeholders=False,
                postlex=_TokenLimit(), cache=_cache_file(grammar))


def _describe_expected(expected: set[str]) -> str:
    names = sorted({_WORDS.get(t, t.upper() if t.isupper() and not t.startswith("__") else repr(t)) for t in expected})
    if len(names) > 8:
        names = names[:8] + [f"... ({len(expected) - 8} more)"]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


_FIRST_WORD = re.compile(r"(?:\s+|--[^\n]*)*([A-Za-z_]\w*)?")


def _statement_keyword(text: str, pos: int) -> str | None:
    """The first word of the statement containing character `pos` (None if it starts with no word)."""
    m = _FIRST_WORD.match(text, text.rfind(";", 0, pos) + 1)
    return m.group(1).upper() if m and m.group(1) else None


def _shown(tok: Token) -> str:
    """A token as quoted in a message, cut short if long."""
    s = str(tok)
    return repr(s if len(s) <= 40 else s[:30] + "...")


def _syntax_error(text: str, e: UnexpectedInput) -> LqlSyntaxError:
    line, column = getattr(e, "line", 1) or 1, getattr(e, "column", 1) or 1
    pos = getattr(e, "pos_in_stream", None) or 0
    if isinstance(e, UnexpectedCharacters):
        if pos >= len(text):
            return LqlSyntaxError("unexpected end of input", text, line, column)
        if text[pos] in "\"'":
            return LqlSyntaxError("unterminated string", text, line, column, f"close it with {text[pos]}")
        return LqlSyntaxError(f"unexpected character {text[pos]!r}", text, line, column,
                              "strings need double or single quotes; comments start with --")
    keyword = _statement_keyword(text, pos)
    if isinstance(e, UnexpectedEOF) or (isinstance(e, UnexpectedToken) and e.token.type == "$END"):
        expected = _describe_expected(set(e.expected))
        lines = text.splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
        message = f"the statement ends too early: expected {expected}"
    else:
        assert isinstance(e, UnexpectedToken)
        tok: Token = e.token
        expected_set = set(e.expected)
        if keyword not in EXAMPLES:
            return LqlSyntaxError(f"unknown statement {repr(keyword) if keyword else _shown(tok)}", text, line, column,
                                  "statements start with a keyword such as USE, DESCRIBE, WALK, SELECT, INFER")
        if str(tok).upper() in ("OR", "NOT", "BETWEEN"):
            return LqlSyntaxError(f"{str(tok).upper()} is not supported: WHERE conditions are joined by AND only",
                                  text, line, column, "run one statement per alternative")
        what = _describe_expected(expected_set)
        stack = e.interactive_parser.parser_state.value_stack if e.interactive_parser else []
        prev = stack[-1] if stack else None
        after = f" after {str(prev).upper()[:40]}" if isinstance(prev, Token) and prev.type.isupper() and prev.type != "STRING" else ""
        message = f"expected {what}{after}, found {_shown(tok)}"
        if expected_set == {"STRING"} and keyword in ("DESCRIBE", "WALK", "INFER", "TRACE", "USE"):
            noun = {"DESCRIBE": "entity", "USE": "path"}.get(keyword, "prompt")
            message = f"expected a quoted {noun}{after}, found {_shown(tok)}"
    hint = f"e.g. {EXAMPLES[keyword]}" if keyword in EXAMPLES else ""
    return LqlSyntaxError(message, text, line, column, hint)


def parse(text: str) -> list[ast.Statement]:
    """Parse LQL source (one or more statements separated by ';') into AST nodes.

    Example:
        >>> parse('DESCRIBE "France" VERBOSE; WALK "The capital of France is" TOP 5')
    """
    _check_source(text)
    try:
        tree = _lark().parse(text)
        return ToAst(text).transform(tree)  # type: ignore[no-any-return]
    except VisitError as e:  # an error raised inside the transformer
        if isinstance(e.orig_exc, LqlError):
            raise e.orig_exc from None
        raise
    except UnexpectedInput as e:
        raise _syntax_error(text, e) from None
    except _TooManyTokens as e:
        raise LqlSyntaxError(f"the input has more than {MAX_TOKENS:,} tokens", text, e.token.line or 1,
                             e.token.column or 1, "split it into several inputs (scripts or REPL entries)") from None


def _check_source(text: str) -> None:
    """Refuse, before lexing, an input that is too long or holds a NUL or a lone surrogate."""
    if len(text) > MAX_SOURCE:
        raise LqlSyntaxError(f"the input has {len(text):,} characters, more than {MAX_SOURCE:,}", text, 1, 1,
                             "split it into several inputs (scripts or REPL entries)")
    bad = BAD_CHARS.search(text)
    if bad:
        pos = bad.start()
        line = text.count("\n", 0, pos) + 1
        column = pos - text.rfind("\n", 0, pos)
        what = "a NUL character" if bad.group() == "\x00" else f"a lone surrogate (U+{ord(bad.group()):04X})"
        raise LqlSyntaxError(f"{what} is not allowed in LQL", text, line, column,
                             "the text is not valid Unicode: check how it was read or typed")


def parse_one(text: str) -> ast.Statement:
    statements = parse(text)
    if len(statements) != 1:
        raise LqlSyntaxError(f"expected exactly one statement, found {len(statements)}", text, 1, 1)
    return statements[0]
