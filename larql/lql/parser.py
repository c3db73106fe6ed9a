"""parse(text) -> list[Statement]: Lark LALR over grammar/lql.lark, errors as LqlSyntaxError."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from larql.errors import LqlError, LqlSyntaxError
from larql.lql import ast
from larql.lql.transformer import ToAst

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
    "INSERT": 'INSERT INTO EDGES (entity, relation, target) VALUES ("Atlantis", "capital", "Poseidon")',
    "DELETE": 'DELETE FROM EDGES WHERE layer = 12 AND feature = 7',
    "UPDATE": 'UPDATE EDGES SET target = "Lyon" WHERE entity = "France"',
    "MERGE": 'MERGE "other.vindex"',
    "REBALANCE": "REBALANCE UNTIL CONVERGED MAX 8",
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


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(GRAMMAR.read_text(), parser="lalr", strict=True, propagate_positions=True, maybe_placeholders=False)


def _describe_expected(expected: set[str]) -> str:
    names = sorted({_WORDS.get(t, t.upper() if t.isupper() and not t.startswith("__") else repr(t)) for t in expected})
    if len(names) > 8:
        names = names[:8] + [f"... ({len(expected) - 8} more)"]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _statement_keyword(text: str, pos: int) -> str | None:
    """The first word of the statement containing character `pos`."""
    start = text.rfind(";", 0, pos) + 1
    lines = [ln for ln in text[start:].splitlines() if ln.strip() and not ln.strip().startswith("--")]
    words = lines[0].split() if lines else []
    return words[0].upper().strip("\"'") if words else None


def _syntax_error(text: str, e: UnexpectedInput) -> LqlSyntaxError:
    line, column = getattr(e, "line", 1) or 1, getattr(e, "column", 1) or 1
    pos = getattr(e, "pos_in_stream", None) or 0
    if isinstance(e, UnexpectedCharacters):
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
            return LqlSyntaxError(f"unknown statement {keyword or str(tok)!r}", text, line, column,
                                  "statements start with a keyword such as USE, DESCRIBE, WALK, SELECT, INFER")
        if str(tok).upper() in ("OR", "NOT", "BETWEEN"):
            return LqlSyntaxError(f"{str(tok).upper()} is not supported: WHERE conditions are joined by AND only",
                                  text, line, column, "run one statement per alternative")
        what = _describe_expected(expected_set)
        prev = e.interactive_parser.parser_state.value_stack[-1] if e.interactive_parser else None
        after = f" after {str(prev).upper()}" if isinstance(prev, Token) and prev.type.isupper() and prev.type != "STRING" else ""
        message = f"expected {what}{after}, found {str(tok)!r}"
        if expected_set == {"STRING"} and keyword in ("DESCRIBE", "WALK", "INFER", "TRACE", "USE"):
            noun = {"DESCRIBE": "entity", "USE": "path"}.get(keyword, "prompt")
            message = f"expected a quoted {noun}{after}, found {str(tok)!r}"
    hint = f"e.g. {EXAMPLES[keyword]}" if keyword in EXAMPLES else ""
    return LqlSyntaxError(message, text, line, column, hint)


def parse(text: str) -> list[ast.Statement]:
    """Parse LQL source (one or more statements separated by ';') into AST nodes.

    Example:
        >>> parse('DESCRIBE "France" VERBOSE; WALK "The capital of France is" TOP 5')
    """
    try:
        tree = _lark().parse(text)
        return ToAst(text).transform(tree)  # type: ignore[no-any-return]
    except VisitError as e:  # an error raised inside the transformer
        if isinstance(e.orig_exc, LqlError):
            raise e.orig_exc from None
        raise
    except UnexpectedInput as e:
        raise _syntax_error(text, e) from None


def parse_one(text: str) -> ast.Statement:
    statements = parse(text)
    if len(statements) != 1:
        raise LqlSyntaxError(f"expected exactly one statement, found {len(statements)}", text, 1, 1)
    return statements[0]
