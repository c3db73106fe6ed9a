"""Lark parse tree -> AST. One method per grammar rule; the only module that sees lark.Tree/Token."""

from __future__ import annotations

import ast as pyast
from dataclasses import dataclass
from typing import Any

from lark import Token, Transformer, v_args
from lark.tree import Meta

from larql.errors import LqlSyntaxError
from larql.lql import ast


@dataclass(frozen=True)
class Opt:
    """An optional clause on its way into its statement: which field, its value, where it was."""

    key: str
    value: Any
    meta: Meta | None = None


def _unquote(tok: Token) -> str:
    raw = str(tok)
    body = raw[1:-1]
    if "\\" not in body:
        return body
    return str(pyast.literal_eval('"' + body.replace('"', '\\"') + '"')) if raw[0] == "'" else str(pyast.literal_eval(raw))


def _strings(children: list[Any]) -> list[str]:
    return [_unquote(c) for c in children if isinstance(c, Token) and c.type == "STRING"]


def _ints(children: list[Any]) -> list[int]:
    return [int(c) for c in children if isinstance(c, Token) and c.type == "INT"]


def _kw(children: list[Any], *types: str) -> str | None:
    for c in children:
        if isinstance(c, Token) and c.type in types:
            return c.type.lower()
    return None


def _span(meta: Meta) -> ast.Span:
    if getattr(meta, "empty", True):
        return ast.NO_SPAN
    return ast.Span(meta.line, meta.column, meta.end_line, meta.end_column, meta.start_pos, meta.end_pos)


class ToAst(Transformer):  # type: ignore[type-arg]
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

    # ---- shared pieces
    def start(self, children: list[Any]) -> list[ast.Statement]:
        return [c for c in children if isinstance(c, ast.Statement)]

    @v_args(meta=True)
    def pipe(self, meta: Meta, children: list[Any]) -> ast.PipeStmt:
        return ast.PipeStmt(tuple(children), span=_span(meta))

    @v_args(meta=True)
    def range(self, meta: Meta, children: list[Any]) -> ast.Range:
        start, end = _ints(children)
        if start > end:
            raise LqlSyntaxError(f"layer range {start}-{end} is empty", self.text, meta.line, meta.column,
                                 f"ranges go from low to high, e.g. {end}-{start}")
        return ast.Range(start, end)

    def name(self, children: list[Any]) -> str:
        return str(children[0]).lower()

    def number(self, children: list[Any]) -> int | float:
        tok = children[0]
        return float(tok) if tok.type == "FLOAT" else int(tok)

    def negative(self, children: list[Any]) -> int | float:
        tok = children[-1]
        return -(float(tok) if tok.type == "FLOAT" else int(tok))

    def string_value(self, children: list[Any]) -> str:
        return _unquote(children[0])

    def number_value(self, children: list[Any]) -> int | float:
        return children[0]  # type: ignore[no-any-return]

    def op(self, children: list[Any]) -> str:
        return str(children[0])

    def compare_condition(self, children: list[Any]) -> ast.Condition:
        return ast.Condition(children[0], children[1], children[2])

    def like_condition(self, children: list[Any]) -> ast.Condition:
        return ast.Condition(children[0], "LIKE", _strings(children)[0])

    def in_condition(self, children: list[Any]) -> ast.Condition:
        values = tuple(c for c in children[1:] if not isinstance(c, Token))
        return ast.Condition(children[0], "IN", values)

    @v_args(meta=True)
    def where_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("where", tuple(c for c in children if isinstance(c, ast.Condition)), meta)

    @v_args(meta=True)
    def top_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("top", _ints(children)[0], meta)

    @v_args(meta=True)
    def limit_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("limit", _ints(children)[0], meta)

    @v_args(meta=True)
    def layers_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("layers", children[-1], meta)

    @v_args(meta=True)
    def at_layer(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("at_layer", _ints(children)[0], meta)

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
        strings = _strings(children)
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
        model, into = _strings(children)[:2]
        o = self._options(children, "EXTRACT")
        return ast.ExtractStmt(model, into, o.get("components"), o.get("layers"), o.get("level", "browse"),
                               span=_span(meta))

    def format_clause(self, children: list[Any]) -> str | None:
        return _kw(children, "SAFETENSORS", "GGUF")

    def compile_conflict(self, children: list[Any]) -> str | None:
        return _kw(children, "LAST_WINS", "HIGHEST_CONFIDENCE", "FAIL")

    @v_args(meta=True)
    def compile_model(self, meta: Meta, children: list[Any]) -> ast.CompileStmt:
        fmt = next((c for c in children[2:] if isinstance(c, str) and not isinstance(c, Token)), None)
        return ast.CompileStmt(children[1], "model", _strings(children[2:])[0], format=fmt, span=_span(meta))

    @v_args(meta=True)
    def compile_vindex(self, meta: Meta, children: list[Any]) -> ast.CompileStmt:
        conflict = next((c for c in children[2:] if isinstance(c, str) and not isinstance(c, Token)), None)
        return ast.CompileStmt(children[1], "vindex", _strings(children[2:])[0], on_conflict=conflict, span=_span(meta))

    @v_args(meta=True)
    def diff_layer(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("layer", _ints(children)[0], meta)

    @v_args(meta=True)
    def diff_relation(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("relation", _strings(children)[0], meta)

    @v_args(meta=True)
    def into_patch(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("into_patch", _strings(children)[0], meta)

    @v_args(meta=True)
    def diff(self, meta: Meta, children: list[Any]) -> ast.DiffStmt:
        o = self._options(children, "DIFF")
        return ast.DiffStmt(children[1], children[2], o.get("layer"), o.get("relation"), o.get("limit"),
                            o.get("into_patch"), span=_span(meta))

    @v_args(meta=True)
    def use_vindex(self, meta: Meta, children: list[Any]) -> ast.UseStmt:
        return ast.UseStmt("vindex", _strings(children)[0], span=_span(meta))

    @v_args(meta=True)
    def use_model(self, meta: Meta, children: list[Any]) -> ast.UseStmt:
        return ast.UseStmt("model", _strings(children)[0], _kw(children, "AUTO_EXTRACT") is not None, span=_span(meta))

    @v_args(meta=True)
    def use_remote(self, meta: Meta, children: list[Any]) -> ast.UseStmt:
        return ast.UseStmt("remote", _strings(children)[0], span=_span(meta))

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
        return ast.WalkStmt(_strings(children)[0], o.get("top"), o.get("layers"), o.get("mode"),
                            o.get("compare", False), span=_span(meta))

    @v_args(meta=True)
    def describe(self, meta: Meta, children: list[Any]) -> ast.DescribeStmt:
        o = self._options(children, "DESCRIBE")
        return ast.DescribeStmt(_strings(children)[0], o.get("band"), o.get("at_layer"),
                                o.get("relations_only", False), o.get("mode"), span=_span(meta))

    def select_star(self, children: list[Any]) -> tuple[str, ...]:
        return ()

    def select_names(self, children: list[Any]) -> tuple[str, ...]:
        return tuple(children)

    def source(self, children: list[Any]) -> str:
        return str(children[0]).lower()

    @v_args(meta=True)
    def nearest(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("nearest", ast.Nearest(_strings(children)[0], _ints(children)[0]), meta)

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
        return ast.ExplainWalkStmt(_strings(children)[0], **self._explain(children, "EXPLAIN WALK"), span=_span(meta))

    @v_args(meta=True)
    def explain_infer(self, meta: Meta, children: list[Any]) -> ast.ExplainInferStmt:
        attention = any(isinstance(c, Opt) and c.key == "with_attention" for c in children)
        return ast.ExplainInferStmt(_strings(children)[0], **self._explain(children, "EXPLAIN INFER"),
                                    with_attention=attention, span=_span(meta))

    # ---- inference
    @v_args(meta=True)
    def infer(self, meta: Meta, children: list[Any]) -> ast.InferStmt:
        o = self._options(children, "INFER")
        return ast.InferStmt(_strings(children)[0], o.get("top"), o.get("compare", False), span=_span(meta))

    @v_args(meta=True)
    def trace_for(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("for_token", _strings(children)[0], meta)

    @v_args(meta=True)
    def decompose_flag(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("decompose", True, meta)

    @v_args(meta=True)
    def positions(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("positions", _kw(children, "LAST", "ALL"), meta)

    @v_args(meta=True)
    def save_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("save", _strings(children)[0], meta)

    @v_args(meta=True)
    def trace(self, meta: Meta, children: list[Any]) -> ast.TraceStmt:
        o = self._options(children, "TRACE")
        return ast.TraceStmt(_strings(children)[0], o.get("for_token"), o.get("decompose", False), o.get("layers"),
                             o.get("positions"), o.get("save"), span=_span(meta))

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
    def insert(self, meta: Meta, children: list[Any]) -> ast.InsertStmt:
        columns = [c for c in children if isinstance(c, str) and not isinstance(c, Token)][:3]
        if columns != ["entity", "relation", "target"]:
            raise LqlSyntaxError(f"INSERT INTO EDGES takes the columns (entity, relation, target), not "
                                 f"({', '.join(columns)})", self.text, meta.line, meta.column)
        entity, relation, target = _strings(children)[:3]
        o = self._options(children, "INSERT")
        return ast.InsertStmt(entity, relation, target, o.get("at_layer"), o.get("confidence"), o.get("alpha"),
                              o.get("mode"), span=_span(meta))

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
        return Opt("into", _strings(children)[0], meta)

    @v_args(meta=True)
    def merge_conflict(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("on_conflict", _kw(children, "KEEP_SOURCE", "KEEP_TARGET", "HIGHEST_CONFIDENCE"), meta)

    @v_args(meta=True)
    def merge(self, meta: Meta, children: list[Any]) -> ast.MergeStmt:
        o = self._options(children, "MERGE")
        return ast.MergeStmt(_strings(children)[0], o.get("into"), o.get("on_conflict"), span=_span(meta))

    @v_args(meta=True)
    def until_converged(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("until_converged", True, meta)

    @v_args(meta=True)
    def max_clause(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("max_iters", _ints(children)[0], meta)

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
                                 o.get("ceiling"), span=_span(meta))

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
        return ast.BeginPatchStmt(_strings(children)[0], span=_span(meta))

    @v_args(meta=True)
    def save_patch(self, meta: Meta, children: list[Any]) -> ast.SavePatchStmt:
        return ast.SavePatchStmt(span=_span(meta))

    @v_args(meta=True)
    def apply_patch(self, meta: Meta, children: list[Any]) -> ast.ApplyPatchStmt:
        return ast.ApplyPatchStmt(_strings(children)[0], span=_span(meta))

    @v_args(meta=True)
    def show_patches(self, meta: Meta, children: list[Any]) -> ast.ShowPatchesStmt:
        return ast.ShowPatchesStmt(span=_span(meta))

    @v_args(meta=True)
    def remove_patch(self, meta: Meta, children: list[Any]) -> ast.RemovePatchStmt:
        return ast.RemovePatchStmt(_strings(children)[0], span=_span(meta))

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
        return ast.ShowFeaturesStmt(_ints(children)[0], o.get("where", ()), o.get("limit"), span=_span(meta))

    @v_args(meta=True)
    def bare_layer(self, meta: Meta, children: list[Any]) -> Opt:
        return Opt("at_layer", _ints(children)[0], meta)

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
        strings = _strings(children)
        return ast.StatsStmt(strings[0] if strings else None, span=_span(meta))
