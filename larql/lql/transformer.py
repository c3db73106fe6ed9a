"""Lark parse tree -> AST. One method per grammar rule; the only module that sees lark.Tree/Token."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any

from lark import Token, Transformer, v_args
from lark.tree import Meta

from larql.errors import LqlSyntaxError
from larql.lql import ast

# ---- lexical limits (vindex_spec/LQL.md "Limits"); the parser checks the input-wide ones
MAX_STRING = 65_536  # characters of a string literal's body, as written
MAX_PATH = 1_024  # UTF-8 bytes of a path (USE, EXTRACT, COMPILE, patches, TRACE ... SAVE, STATS, DIFF, MERGE)
MAX_PATH_PART = 240  # UTF-8 bytes of one component: 255, less room for temporary names (.NAME.tmp-PID)
MAX_NAME = 64  # characters of a field name
MAX_NUMBER = 64  # characters of a number literal
MAX_VALUE = 2**53 - 1  # |n| of an integer in WHERE, SET, CONFIDENCE... (exact in a float64)
MAX_COUNT = 2**31 - 1  # a layer, feature, TOP, LIMIT or MAX number

# ---- string escapes: JSON's, plus \' (vindex_spec/LQL.md "Strings")
ESCAPES = {"\\": "\\", '"': '"', "'": "'", "/": "/", "n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}
_ESCAPE_HINT = "escapes are \\\\ \\\" \\' \\/ \\n \\t \\r \\b \\f and \\uXXXX (4 hex digits)"
# NUL, lone surrogates: refused anywhere in the source (parser) and as \u escapes (here)
BAD_CHARS = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True)
class Opt:
    """An optional clause on its way into its statement: which field, its value, where it was."""

    key: str
    value: Any
    meta: Meta | None = None


def _error(text: str, tok: Token, message: str, hint: str = "", offset: int = 0) -> LqlSyntaxError:
    """An error at `tok` (plus `offset` characters, for a spot inside a one-line token)."""
    return LqlSyntaxError(message, text, tok.line or 0, (tok.column or 0) + offset, hint)


_ESCAPE = re.compile(r"\\(u[0-9A-Fa-f]{4}|.?)", re.DOTALL)  # one escape: what follows the backslash


def _decode_escapes(text: str, tok: Token, body: str) -> str:
    """A string literal's body with its escapes decoded; anything but the escapes above is an error.

    Decodes each distinct escape once, and surrogate pairs by a UTF-16 round trip, so a string of
    10,000 escapes costs about a millisecond; an error goes to the slow, exact `_decode_checked`."""
    parts = _ESCAPE.split(body)  # text, escape, text, escape, ..., text
    escapes = parts[1::2]
    table: dict[str, str] = {}
    surrogates = False
    for e in set(escapes):
        if e in ESCAPES:
            table[e] = ESCAPES[e]
        elif len(e) == 5:  # u + 4 hex digits (the regex saw to it)
            code = int(e[1:], 16)
            if code == 0:
                return _decode_checked(text, tok, body)
            surrogates |= 0xD800 <= code < 0xE000
            table[e] = chr(code)
        else:
            return _decode_checked(text, tok, body)
    parts[1::2] = map(table.__getitem__, escapes)
    out = "".join(parts)
    if surrogates:  # pairs become one character; a lone surrogate fails to decode
        try:
            out = out.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
        except UnicodeDecodeError:
            return _decode_checked(text, tok, body)
    return out


def _decode_checked(text: str, tok: Token, body: str) -> str:
    """`_decode_escapes`, one escape at a time: raises at the first escape that is not allowed."""
    parts = _ESCAPE.split(body)  # text, escape, text, escape, ..., text
    k = 1
    while k < len(parts):
        e = parts[k]
        if e in ESCAPES:
            parts[k] = ESCAPES[e]
        elif e[:1] == "u" and len(e) == 5:
            code = int(e[1:], 16)
            nxt = parts[k + 2] if k + 2 < len(parts) and not parts[k + 1] else ""
            if 0xD800 <= code < 0xDC00 and len(nxt) == 5 and nxt[0] == "u" and 0xDC00 <= int(nxt[1:], 16) < 0xE000:
                # a surrogate pair, as JSON writes characters above U+FFFF
                parts[k], parts[k + 2] = chr(0x10000 + ((code - 0xD800) << 10) + (int(nxt[1:], 16) - 0xDC00)), ""
                k += 2
            elif code == 0 or 0xD800 <= code < 0xE000:
                what = "a NUL character" if code == 0 else "a lone surrogate"
                raise _error(text, tok, f"\\{e} is {what}, which strings cannot hold", _ESCAPE_HINT,
                             offset=_escape_offset(body, k))
            else:
                parts[k] = chr(code)
        else:
            message = "\\u needs exactly 4 hex digits" if e == "u" else (
                f"unknown escape \\{e if e.isprintable() else f'U+{ord(e):04X}' if e else ''} in a string")
            raise _error(text, tok, message, _ESCAPE_HINT, offset=_escape_offset(body, k))
        k += 2
    return "".join(parts)


def _escape_offset(body: str, k: int) -> int:
    """The column offset, from the opening quote, of the backslash of the escape at `parts[k]`."""
    return 1 + sum(len(p) + (j % 2) for j, p in enumerate(_ESCAPE.split(body)[:k]))


def _path_parts(path: str) -> list[str]:
    """A path's components, split at '/' (and at the OS's own separator, e.g. '\\' on Windows)."""
    return path.replace(os.sep, "/").split("/")


def _is_string(c: Any) -> bool:
    return isinstance(c, Token) and c.type == "STRING"


def _kw(children: list[Any], *types: str) -> str | None:
    for c in children:
        if isinstance(c, Token) and c.type in types:
            return c.type.lower()
    return None


def _forced(children: list[Any]) -> bool:
    """Whether a rule's children end in FORCE (the force_flag clause)."""
    return any(isinstance(c, Opt) and c.key == "force" for c in children)


def _span(meta: Meta) -> ast.Span:
    if getattr(meta, "empty", True):
        return ast.NO_SPAN
    return ast.Span(meta.line, meta.column, meta.end_line, meta.end_column, meta.start_pos, meta.end_pos)


class ToAst(Transformer):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def _options(self, children: list[Any], statement: str) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for c in children:
            if isinstance(c, Opt):
                if c.key in found:
                    line = c.meta.line if c.meta and not c.meta.empty else 0
                    col = c.meta.column if c.meta and not c.meta.empty else 0
                    clause = c.key.upper().replace("_", " ")
                    raise LqlSyntaxError(f"{statement}: the {clause} clause is given twice", self.text, line, col,
                                         "give each optional clause at most once")
                found[c.key] = c.value
        return found

    # ---- literals: decoded and range-checked here, errors at the token
    def _unquote(self, tok: Token) -> str:
        body = str(tok)[1:-1]
        if len(body) > MAX_STRING:
            raise _error(self.text, tok, f"a string of {len(body):,} characters is too long (at most {MAX_STRING:,})")
        return _decode_escapes(self.text, tok, body) if "\\" in body else body

    def _strings(self, children: list[Any]) -> list[str]:
        return [self._unquote(c) for c in children if _is_string(c)]

    def _path(self, tok: Token) -> str:
        path = self._unquote(tok)
        if not path:
            raise _error(self.text, tok, "an empty path")
        size = len(path.encode("utf-8"))
        if size > MAX_PATH:
            raise _error(self.text, tok, f"a path of {size:,} bytes is too long (at most {MAX_PATH:,})")
        for part in _path_parts(path):
            if len(part.encode("utf-8")) > MAX_PATH_PART:
                raise _error(self.text, tok, f"the path component {part[:20]!r}... is longer than {MAX_PATH_PART} bytes",
                             "file and directory names are at most 255 bytes, and larql needs room for temporary names")
        return path

    def _file_path(self, children: list[Any]) -> str:
        """The path (first string) that must name a file (a patch, a trace): not '.', '..' or 'dir/'."""
        tok = next(c for c in children if _is_string(c))
        path = self._path(tok)
        if _path_parts(path)[-1] in ("", ".", ".."):
            raise _error(self.text, tok, f"{path!r} names a directory, not a file", "give a file name, e.g. \"edits.vlp\"")
        return path

    def _paths(self, children: list[Any]) -> list[str]:
        return [self._path(c) for c in children if _is_string(c)]

    def _int(self, tok: Token, limit: int, what: str) -> int:
        if len(tok) > 16 or int(tok) > limit:
            shown = str(tok) if len(tok) <= 24 else f"{str(tok)[:12]}...({len(tok)} digits)"
            raise _error(self.text, tok, f"{shown} is out of range for {what} (at most {limit:,})")
        return int(tok)

    def _ints(self, children: list[Any], what: str = "a layer or count") -> list[int]:
        return [self._int(c, MAX_COUNT, what) for c in children if isinstance(c, Token) and c.type == "INT"]

    def _number(self, tok: Token) -> int | float:
        if len(tok) > MAX_NUMBER:
            raise _error(self.text, tok, f"a number of {len(tok):,} characters is too long (at most {MAX_NUMBER})")
        if tok.type == "INT":
            return self._int(tok, MAX_VALUE, "a number (|n| < 2^53)")
        x = float(tok)
        if not math.isfinite(x):
            raise _error(self.text, tok, f"{tok} is not a finite number")
        return x

    # ---- shared pieces
    def start(self, children: list[Any]) -> list[ast.Statement]:
        return [c for c in children if isinstance(c, ast.Statement)]

    @v_args(meta=True)
    def pipe(self, meta: Meta, children: list[Any]) -> ast.PipeStmt:
        return ast.PipeStmt(tuple(children), span=_span(meta))

    @v_args(meta=True)
    def range(self, meta: Meta, children: list[Any]) -> ast.Range:
        start, end = self._ints(children)
        if start > end:
            raise LqlSyntaxError(f"layer range {start}-{end} is empty", self.text, meta.line, meta.column,
                                 f"ranges go from low to high, e.g. {end}-{start}")
        return ast.Range(start, end)

    def name(self, children: list[Any]) -> str:
        tok = children[0]
        if len(tok) > MAX_NAME:
            raise _error(self.text, tok, f"a field name of {len(tok):,} characters is too long (at most {MAX_NAME})")
        return str(tok).lower()

    def number(self, children: list[Any]) -> int | float:
        return self._number(children[0])

    def negative(self, children: list[Any]) -> int | float:
        return -self._number(children[-1])

    def string_value(self, children: list[Any]) -> str:
        return self._unquote(children[0])

    def number_value(self, children: list[Any]) -> int | float:
        return children[0]

    def op(self, children: list[Any]) -> str:
        return str(children[0])

    def compare_condition(self, children: list[Any]) -> ast.Condition:
        return ast.Condition(children[0], children[1], children[2])

    def like_condition(self, children: list[Any]) -> ast.Condition:
        return ast.Condition(children[0], "LIKE", self._strings(children)[0])

    def in_condition(self, children: list[Any]) -> ast.Condition:
        values = tuple(c for c in children[1:] if not isinstance(c, Token))
        return ast.Condition(children[0], "IN", values)

    @v_args(meta=True)
    def where_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("where", tuple(c for c in children if isinstance(c, ast.Condition)), meta)

    @v_args(meta=True)
    def top_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("top", self._ints(children)[0], meta)

    @v_args(meta=True)
    def limit_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("limit", self._ints(children)[0], meta)

    @v_args(meta=True)
    def layers_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("layers", children[-1], meta)

    @v_args(meta=True)
    def at_layer(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("at_layer", self._ints(children)[0], meta)

    @v_args(meta=True)
    def relations_only(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("relations_only", True, meta)

    @v_args(meta=True)
    def describe_mode(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("mode", str(children[0]).lower(), meta)

    def _band(self, meta: Meta, value: str) -> Opt:
        return Opt("band", value, meta)

    @v_args(meta=True)
    def band_all(self, meta: Meta, children: list[Any]) -> Opt:
        return self._band(meta, "all")

    @v_args(meta=True)
    def band_syntax(self, meta: Meta, children: list[Any]) -> Opt:
        return self._band(meta, "syntax")

    @v_args(meta=True)
    def band_knowledge(self, meta: Meta, children: list[Any]) -> Opt:
        return self._band(meta, "knowledge")

    @v_args(meta=True)
    def band_output(self, meta: Meta, children: list[Any]) -> Opt:
        return self._band(meta, "output")

    @v_args(meta=True)
    def compare_flag(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("compare", True, meta)

    @v_args(meta=True)
    def verbose_flag(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("verbose", True, meta)

    def vindex_ref(self, children: list[Any]) -> str | None:
        strings = self._paths(children)
        return strings[0] if strings else None

    # ---- lifecycle
    @v_args(meta=True)
    def components(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("components", tuple(c for c in children if isinstance(c, str) and not isinstance(c, Token)), meta)

    @v_args(meta=True)
    def extract_with(self, meta: Meta, children: list[Any]) -> Opt:
        level = _kw(children, "INFERENCE", "ALL", "WEIGHTS")
        return Opt("level", "inference" if level == "weights" else level, meta)

    @v_args(meta=True)
    def extract(self, meta: Meta, children: list[Any]) -> ast.ExtractStmt:
        model, into = self._paths(children)[:2]
        o = self._options(children, "EXTRACT")
        return ast.ExtractStmt(model, into, o.get("components"), o.get("layers"), o.get("level", "browse"),
                               o.get("force", False), span=_span(meta))

    @v_args(meta=True)
    def force_flag(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("force", True, meta)

    def format_clause(self, children: list[Any]) -> str | None:
        return _kw(children, "SAFETENSORS", "GGUF")

    def compile_conflict(self, children: list[Any]) -> str | None:
        return _kw(children, "LAST_WINS", "HIGHEST_CONFIDENCE", "FAIL")

    @v_args(meta=True)
    def dtype_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("dtype", _kw(children, "F32", "F16", "BF16"), meta)

    @v_args(meta=True)
    def compile_model(self, meta: Meta, children: list[Any]) -> ast.CompileStmt:
        fmt = next((c for c in children[2:] if isinstance(c, str) and not isinstance(c, Token)), None)
        dtype = next((c.value for c in children if isinstance(c, Opt) and c.key == "dtype"), None)
        return ast.CompileStmt(children[1], "model", self._paths(children[2:])[0], format=fmt,
                               force=_forced(children), dtype=dtype, span=_span(meta))

    @v_args(meta=True)
    def compile_vindex(self, meta: Meta, children: list[Any]) -> ast.CompileStmt:
        conflict = next((c for c in children[2:] if isinstance(c, str) and not isinstance(c, Token)), None)
        return ast.CompileStmt(children[1], "vindex", self._paths(children[2:])[0], on_conflict=conflict,
                               force=_forced(children), span=_span(meta))

    @v_args(meta=True)
    def diff_layer(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("layer", self._ints(children)[0], meta)

    @v_args(meta=True)
    def diff_relation(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("relation", self._strings(children)[0], meta)

    @v_args(meta=True)
    def into_patch(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("into_patch", (self._paths(children)[0], _forced(children)), meta)

    @v_args(meta=True)
    def diff(self, meta: Meta, children: list[Any]) -> ast.DiffStmt:
        o = self._options(children, "DIFF")
        into, force = o.get("into_patch", (None, False))
        return ast.DiffStmt(children[1], children[2], o.get("layer"), o.get("relation"), o.get("limit"),
                            into, force, span=_span(meta))

    @v_args(meta=True)
    def use_vindex(self, meta: Meta, children: list[Any]) -> ast.UseStmt:
        return ast.UseStmt("vindex", self._paths(children)[0], span=_span(meta))

    @v_args(meta=True)
    def use_model(self, meta: Meta, children: list[Any]) -> ast.UseStmt:
        return ast.UseStmt("model", self._paths(children)[0], _kw(children, "AUTO_EXTRACT") is not None, span=_span(meta))

    @v_args(meta=True)
    def use_remote(self, meta: Meta, children: list[Any]) -> ast.UseStmt:
        return ast.UseStmt("remote", self._strings(children)[0], span=_span(meta))

    # ---- sparse autoencoders
    @v_args(meta=True)
    def use_sae(self, meta: Meta, children: list[Any]) -> ast.UseSaeStmt:
        o = self._options(children, "USE SAE")
        return ast.UseSaeStmt(self._paths(children)[0], o.get("at_layer"), o.get("labels"), span=_span(meta))

    @v_args(meta=True)
    def labels_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("labels", self._file_path(children), meta)

    @v_args(meta=True)
    def sae_features(self, meta: Meta, children: list[Any]) -> ast.SaeFeaturesStmt:
        o = self._options(children, "FEATURES")
        return ast.SaeFeaturesStmt(self._strings(children)[0], o.get("at_layer"), o.get("top"), o.get("positions"),
                                   span=_span(meta))

    @v_args(meta=True)
    def sae_feature(self, meta: Meta, children: list[Any]) -> ast.SaeFeatureStmt:
        strings = self._strings(children)
        o = self._options(children, "SAE FEATURE")
        return ast.SaeFeatureStmt(strings[0] if strings else None, self._ints(children)[0], o.get("top"),
                                  span=_span(meta))

    @v_args(meta=True)
    def show_saes(self, meta: Meta, children: list[Any]) -> ast.ShowSaesStmt:
        return ast.ShowSaesStmt(span=_span(meta))

    @v_args(meta=True)
    def drop_sae(self, meta: Meta, children: list[Any]) -> ast.DropSaeStmt:
        strings = self._strings(children)
        return ast.DropSaeStmt(strings[0] if strings else None, span=_span(meta))

    # ---- browse
    @v_args(meta=True)
    def walk_layers(self, meta: Meta, children: list[Any]) -> Opt:
        last = children[-1]
        return Opt("layers", "all" if isinstance(last, Token) and last.type == "ALL" else last, meta)

    @v_args(meta=True)
    def walk_mode(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("mode", _kw(children, "HYBRID", "PURE", "DENSE"), meta)

    @v_args(meta=True)
    def walk(self, meta: Meta, children: list[Any]) -> ast.WalkStmt:
        o = self._options(children, "WALK")
        return ast.WalkStmt(self._strings(children)[0], o.get("top"), o.get("layers"), o.get("mode"),
                            o.get("compare", False), span=_span(meta))

    @v_args(meta=True)
    def describe(self, meta: Meta, children: list[Any]) -> ast.DescribeStmt:
        o = self._options(children, "DESCRIBE")
        return ast.DescribeStmt(self._strings(children)[0], o.get("band"), o.get("at_layer"),
                                o.get("relations_only", False), o.get("mode"), span=_span(meta))

    def select_star(self, children: list[Any]) -> tuple[str, ...]:
        return ()

    def select_names(self, children: list[Any]) -> tuple[str, ...]:
        return tuple(children)

    def source(self, children: list[Any]) -> str:
        return str(children[0]).lower()

    @v_args(meta=True)
    def nearest(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("nearest", ast.Nearest(self._strings(children)[0], self._ints(children)[0]), meta)

    @v_args(meta=True)
    def order_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("order", ast.OrderBy(children[2], _kw(children, "DESC") is not None), meta)

    @v_args(meta=True)
    def select(self, meta: Meta, children: list[Any]) -> ast.SelectStmt:
        o = self._options(children, "SELECT")
        return ast.SelectStmt(children[1], children[3], o.get("nearest"), o.get("where", ()), o.get("order"),
                              o.get("limit"), span=_span(meta))

    @v_args(meta=True)
    def with_attention(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("with_attention", True, meta)

    def _explain(self, children: list[Any], statement: str) -> dict[str, Any]:
        o = self._options(children, statement)
        return {"layers": o.get("layers"), "verbose": o.get("verbose", False), "top": o.get("top"),
                "band": o.get("band"), "relations_only": o.get("relations_only", False)}

    @v_args(meta=True)
    def explain_walk(self, meta: Meta, children: list[Any]) -> ast.ExplainWalkStmt:
        return ast.ExplainWalkStmt(self._strings(children)[0], **self._explain(children, "EXPLAIN WALK"), span=_span(meta))

    @v_args(meta=True)
    def explain_infer(self, meta: Meta, children: list[Any]) -> ast.ExplainInferStmt:
        attention = any(isinstance(c, Opt) and c.key == "with_attention" for c in children)
        return ast.ExplainInferStmt(self._strings(children)[0], **self._explain(children, "EXPLAIN INFER"),
                                    with_attention=attention, span=_span(meta))

    # ---- inference
    @v_args(meta=True)
    def infer(self, meta: Meta, children: list[Any]) -> ast.InferStmt:
        o = self._options(children, "INFER")
        return ast.InferStmt(self._strings(children)[0], o.get("top"), o.get("compare", False), o.get("steer"),
                             span=_span(meta))

    @v_args(meta=True)
    def steer_clause(self, meta: Meta, children: list[Any]) -> Opt:
        strings = self._strings(children)
        return Opt("steer", ast.Steer(strings[0] if strings else None, self._ints(children)[0],
                                      float(children[-1])), meta)

    @v_args(meta=True)
    def trace_for(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("for_token", self._strings(children)[0], meta)

    @v_args(meta=True)
    def decompose_flag(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("decompose", True, meta)

    @v_args(meta=True)
    def positions(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("positions", _kw(children, "LAST", "ALL"), meta)

    @v_args(meta=True)
    def save_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("save", (self._file_path(children), _forced(children)), meta)

    @v_args(meta=True)
    def trace(self, meta: Meta, children: list[Any]) -> ast.TraceStmt:
        o = self._options(children, "TRACE")
        save, force = o.get("save", (None, False))
        return ast.TraceStmt(self._strings(children)[0], o.get("for_token"), o.get("decompose", False), o.get("layers"),
                             o.get("positions"), save, force, span=_span(meta))

    # ---- mutation
    @v_args(meta=True)
    def confidence_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("confidence", float(children[-1]), meta)

    @v_args(meta=True)
    def alpha_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("alpha", float(children[-1]), meta)

    @v_args(meta=True)
    def mode_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("mode", _kw(children, "KNN", "COMPOSE"), meta)

    @v_args(meta=True)
    def method_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("method", _kw(children, "ROME", "MEMIT", "FEATURE", "NEURON"), meta)

    def value_row(self, children: list[Any]) -> tuple[str, ...]:
        return tuple(self._strings(children))

    @v_args(meta=True)
    def insert(self, meta: Meta, children: list[Any]) -> ast.InsertStmt:
        columns = tuple(c.lower() for c in children if isinstance(c, str) and not isinstance(c, Token))
        required = ("entity", "relation", "target")
        if (len(set(columns)) != len(columns) or any(c not in ast.INSERT_COLUMNS for c in columns)
                or any(c not in columns for c in required)):
            raise LqlSyntaxError(f"INSERT INTO EDGES takes the columns (entity, relation, target) and optionally "
                                 f"prompt and key, not ({', '.join(columns)})", self.text, meta.line, meta.column)
        rows = tuple(c for c in children if isinstance(c, tuple))
        for r in rows:
            if len(r) != len(columns):
                raise LqlSyntaxError(f"each VALUES row needs {len(columns)} values ({', '.join(columns)}), "
                                     f"one has {len(r)}", self.text, meta.line, meta.column)
        o = self._options(children, "INSERT")
        at = next((c.meta for c in children if isinstance(c, Opt) and c.key == "layers" and c.meta), meta)
        if o.get("at_layer") is not None and o.get("layers") is not None:
            raise LqlSyntaxError("INSERT takes AT LAYER n or LAYERS a-b, not both", self.text, at.line, at.column)
        if o.get("layers") is not None and o.get("method") == "feature":
            raise LqlSyntaxError("METHOD FEATURE installs a feature at one layer: use AT LAYER n", self.text,
                                 at.line, at.column, "LAYERS a-b spreads a weight edit (ROME / MEMIT)")
        return ast.InsertStmt(columns, rows, o.get("at_layer"), o.get("confidence"), o.get("alpha"),
                              o.get("mode"), o.get("method"), o.get("layers"), span=_span(meta))

    @v_args(meta=True)
    def crown_subject(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("subject", self._strings(children)[0], meta)

    @v_args(meta=True)
    def crown(self, meta: Meta, children: list[Any]) -> ast.CrownStmt:
        strings = self._strings(children)
        o = self._options(children, "CROWN")
        return ast.CrownStmt(strings[0], strings[1], o.get("subject"), span=_span(meta))

    @v_args(meta=True)
    def delete(self, meta: Meta, children: list[Any]) -> ast.DeleteStmt:
        return ast.DeleteStmt(self._options(children, "DELETE")["where"], span=_span(meta))

    def assignment(self, children: list[Any]) -> ast.Assignment:
        return ast.Assignment(children[0], children[1])

    @v_args(meta=True)
    def update(self, meta: Meta, children: list[Any]) -> ast.UpdateStmt:
        assignments = tuple(c for c in children if isinstance(c, ast.Assignment))
        return ast.UpdateStmt(assignments, self._options(children, "UPDATE")["where"], span=_span(meta))

    @v_args(meta=True)
    def merge_into(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("into", self._paths(children)[0], meta)

    @v_args(meta=True)
    def merge_conflict(self, meta: Meta, children: list[Any]) -> Opt:
        policy = _kw(children, "LAST_WINS", "KEEP_CURRENT", "HIGHEST_CONFIDENCE", "FAIL", "KEEP_SOURCE", "KEEP_TARGET")
        renamed = {"keep_source": "last_wins", "keep_target": "keep_current"}
        return Opt("on_conflict", renamed.get(policy, policy) if policy is not None else None, meta)

    @v_args(meta=True)
    def merge(self, meta: Meta, children: list[Any]) -> ast.MergeStmt:
        o = self._options(children, "MERGE")
        return ast.MergeStmt(self._paths(children)[0], o.get("into"), o.get("on_conflict"), span=_span(meta))

    @v_args(meta=True)
    def until_converged(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("until_converged", True, meta)

    @v_args(meta=True)
    def max_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("max_iters", self._ints(children)[0], meta)

    @v_args(meta=True)
    def floor_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("floor", float(children[-1]), meta)

    @v_args(meta=True)
    def ceiling_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("ceiling", float(children[-1]), meta)

    @v_args(meta=True)
    def rebalance(self, meta: Meta, children: list[Any]) -> ast.RebalanceStmt:
        o = self._options(children, "REBALANCE")
        return ast.RebalanceStmt(o.get("until_converged", False), o.get("max_iters"), o.get("floor"),
                                 o.get("ceiling"), o.get("at_layer"), span=_span(meta))

    @v_args(meta=True)
    def compact_minor(self, meta: Meta, children: list[Any]) -> ast.CompactStmt:
        return ast.CompactStmt("minor", span=_span(meta))

    def compact_full(self, children: list[Any]) -> bool:
        return True

    def lambda_clause(self, children: list[Any]) -> float:
        return float(children[-1])

    @v_args(meta=True)
    def compact_major(self, meta: Meta, children: list[Any]) -> ast.CompactStmt:
        full = any(c is True for c in children)
        lam = next((c for c in children if isinstance(c, float)), None)
        return ast.CompactStmt("major", full, lam, span=_span(meta))

    # ---- patches
    @v_args(meta=True)
    def begin_patch(self, meta: Meta, children: list[Any]) -> ast.BeginPatchStmt:
        return ast.BeginPatchStmt(self._file_path(children), _forced(children), span=_span(meta))

    @v_args(meta=True)
    def save_patch(self, meta: Meta, children: list[Any]) -> ast.SavePatchStmt:
        return ast.SavePatchStmt(_forced(children), span=_span(meta))

    @v_args(meta=True)
    def apply_patch(self, meta: Meta, children: list[Any]) -> ast.ApplyPatchStmt:
        return ast.ApplyPatchStmt(self._file_path(children), span=_span(meta))

    @v_args(meta=True)
    def show_patches(self, meta: Meta, children: list[Any]) -> ast.ShowPatchesStmt:
        return ast.ShowPatchesStmt(span=_span(meta))

    @v_args(meta=True)
    def remove_patch(self, meta: Meta, children: list[Any]) -> ast.RemovePatchStmt:
        return ast.RemovePatchStmt(self._file_path(children), span=_span(meta))

    # ---- introspection
    @v_args(meta=True)
    def with_examples(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("with_examples", True, meta)

    @v_args(meta=True)
    def show_relations(self, meta: Meta, children: list[Any]) -> ast.ShowRelationsStmt:
        o = self._options(children, "SHOW RELATIONS")
        return ast.ShowRelationsStmt(o.get("at_layer"), o.get("with_examples", False), o.get("mode"), span=_span(meta))

    @v_args(meta=True)
    def show_layers(self, meta: Meta, children: list[Any]) -> ast.ShowLayersStmt:
        rng = next((c for c in children if isinstance(c, ast.Range)), None)
        return ast.ShowLayersStmt(rng, span=_span(meta))

    @v_args(meta=True)
    def show_features(self, meta: Meta, children: list[Any]) -> ast.ShowFeaturesStmt:
        o = self._options(children, "SHOW FEATURES")
        return ast.ShowFeaturesStmt(self._ints(children)[0], o.get("where", ()), o.get("limit"), span=_span(meta))

    @v_args(meta=True)
    def bare_layer(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("at_layer", self._ints(children)[0], meta)

    @v_args(meta=True)
    def show_entities(self, meta: Meta, children: list[Any]) -> ast.ShowEntitiesStmt:
        o = self._options(children, "SHOW ENTITIES")
        return ast.ShowEntitiesStmt(o.get("at_layer"), o.get("limit"), span=_span(meta))

    @v_args(meta=True)
    def show_models(self, meta: Meta, children: list[Any]) -> ast.ShowModelsStmt:
        return ast.ShowModelsStmt(span=_span(meta))

    @v_args(meta=True)
    def show_compact_status(self, meta: Meta, children: list[Any]) -> ast.ShowCompactStatusStmt:
        return ast.ShowCompactStatusStmt(span=_span(meta))

    @v_args(meta=True)
    def stats(self, meta: Meta, children: list[Any]) -> ast.StatsStmt:
        strings = self._paths(children)
        return ast.StatsStmt(strings[0] if strings else None, span=_span(meta))
