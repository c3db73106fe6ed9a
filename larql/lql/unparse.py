"""AST -> canonical LQL: upper-case keywords, double-quoted strings, clauses in one fixed order.

`parse(unparse(s)) == s` for every statement (tests check it on every fixture).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from larql.lql import ast


def q(s: str) -> str:
    """A double-quoted LQL string (JSON escaping, which the grammar reads back)."""
    return json.dumps(s, ensure_ascii=False)


def _value(v: ast.Value) -> str:
    if isinstance(v, str):
        return q(v)
    if isinstance(v, tuple):
        return "(" + ", ".join(_value(x) for x in v) + ")"
    return repr(v) if isinstance(v, float) else str(v)


def _range(r: ast.Range) -> str:
    return f"{r.start}-{r.end}"


def _where(conds: tuple[ast.Condition, ...]) -> str:
    return "WHERE " + " AND ".join(f"{c.field} {c.op} {_value(c.value)}" for c in conds)


def _ref(r: str | None) -> str:
    return "CURRENT" if r is None else q(r)


def _band(b: str | None) -> list[str]:
    return [] if b is None else ["ALL LAYERS" if b == "all" else b.upper()]


def _join(*parts: str | None) -> str:
    return " ".join(p for p in parts if p)


def _force(force: bool) -> str | None:
    return "FORCE" if force else None


def _extract(s: ast.ExtractStmt) -> str:
    return _join(f"EXTRACT MODEL {q(s.model)} INTO {q(s.into)}",
                 "COMPONENTS " + ", ".join(s.components) if s.components else None,
                 "LAYERS " + _range(s.layers) if s.layers else None,
                 None if s.level == "browse" else "WITH " + s.level.upper(), _force(s.force))


def _compile(s: ast.CompileStmt) -> str:
    head = f"COMPILE {_ref(s.source)} INTO {s.target.upper()} {q(s.into)}"
    if s.target == "model":
        return _join(head, s.format and "FORMAT " + s.format.upper(), s.dtype and "DTYPE " + s.dtype.upper(),
                     _force(s.force))
    return _join(head, s.on_conflict and "ON CONFLICT " + s.on_conflict.upper(), _force(s.force))


def _diff(s: ast.DiffStmt) -> str:
    return _join(f"DIFF {_ref(s.a)} {_ref(s.b)}", (s.layer is not None and f"LAYER {s.layer}") or None,
                 s.relation and f"RELATION {q(s.relation)}", (s.limit is not None and f"LIMIT {s.limit}") or None,
                 s.into_patch and f"INTO PATCH {q(s.into_patch)}", s.into_patch and _force(s.force))


def _use(s: ast.UseStmt) -> str:
    if s.kind == "model":
        return _join(f"USE MODEL {q(s.target)}", "AUTO_EXTRACT" if s.auto_extract else None)
    return f"USE REMOTE {q(s.target)}" if s.kind == "remote" else f"USE {q(s.target)}"


def _walk(s: ast.WalkStmt) -> str:
    layers = None if s.layers is None else "LAYERS " + ("ALL" if s.layers == "all" else _range(s.layers))  # type: ignore[arg-type]
    return _join(f"WALK {q(s.prompt)}", (s.top is not None and f"TOP {s.top}") or None, layers,
                 s.mode and "MODE " + s.mode.upper(), "COMPARE" if s.compare else None)


def _describe(s: ast.DescribeStmt) -> str:
    return _join(f"DESCRIBE {q(s.entity)}", *_band(s.band), (s.at_layer is not None and f"AT LAYER {s.at_layer}") or None,
                 "RELATIONS ONLY" if s.relations_only else None, s.mode and s.mode.upper())


def _select(s: ast.SelectStmt) -> str:
    return _join(f"SELECT {', '.join(s.fields) if s.fields else '*'} FROM {s.source.upper()}",
                 f"NEAREST TO {q(s.nearest.entity)} AT LAYER {s.nearest.layer}" if s.nearest else None,
                 _where(s.where) if s.where else None,
                 f"ORDER BY {s.order.field} {'DESC' if s.order.descending else 'ASC'}" if s.order else None,
                 (s.limit is not None and f"LIMIT {s.limit}") or None)


def _explain_opts(s: ast.ExplainWalkStmt | ast.ExplainInferStmt) -> list[str | None]:
    return ["LAYERS " + _range(s.layers) if s.layers else None, "VERBOSE" if s.verbose else None,
            (s.top is not None and f"TOP {s.top}") or None, *_band(s.band), "RELATIONS ONLY" if s.relations_only else None]


def _explain_walk(s: ast.ExplainWalkStmt) -> str:
    return _join(f"EXPLAIN WALK {q(s.prompt)}", *_explain_opts(s))


def _explain_infer(s: ast.ExplainInferStmt) -> str:
    return _join(f"EXPLAIN INFER {q(s.prompt)}", *_explain_opts(s), "WITH ATTENTION" if s.with_attention else None)


def _infer(s: ast.InferStmt) -> str:
    steer = s.steer and _join("STEER", (s.steer.sae is not None and q(s.steer.sae)) or None,
                              f"FEATURE {s.steer.feature} BY {_num(s.steer.scale)}")
    return _join(f"INFER {q(s.prompt)}", (s.top is not None and f"TOP {s.top}") or None, "COMPARE" if s.compare else None,
                 steer or None)


def _trace(s: ast.TraceStmt) -> str:
    return _join(f"TRACE {q(s.prompt)}", (s.for_token is not None and f"FOR {q(s.for_token)}") or None,
                 "DECOMPOSE" if s.decompose else None, "LAYERS " + _range(s.layers) if s.layers else None,
                 s.positions and "POSITIONS " + s.positions.upper(), (s.save is not None and f"SAVE {q(s.save)}") or None,
                 (s.save is not None and _force(s.force)) or None)


def _num(x: float) -> str:
    return repr(float(x))


def _insert(s: ast.InsertStmt) -> str:
    rows = ", ".join("(" + ", ".join(q(v) for v in r) + ")" for r in s.rows)
    return _join(f"INSERT INTO EDGES ({', '.join(s.columns)}) VALUES {rows}",
                 (s.layer is not None and f"AT LAYER {s.layer}") or None,
                 (s.layers is not None and f"LAYERS {s.layers.start}-{s.layers.end}") or None,
                 (s.confidence is not None and f"CONFIDENCE {_num(s.confidence)}") or None,
                 (s.alpha is not None and f"ALPHA {_num(s.alpha)}") or None, s.mode and "MODE " + s.mode.upper(),
                 s.method and "METHOD " + s.method.upper())


def _update(s: ast.UpdateStmt) -> str:
    sets = ", ".join(f"{a.field} = {_value(a.value)}" for a in s.assignments)
    return f"UPDATE EDGES SET {sets} {_where(s.where)}"


def _merge(s: ast.MergeStmt) -> str:
    return _join(f"MERGE {q(s.source)}", s.into and f"INTO {q(s.into)}", s.on_conflict and "ON CONFLICT " + s.on_conflict.upper())


def _rebalance(s: ast.RebalanceStmt) -> str:
    return _join("REBALANCE", (s.layer is not None and f"AT LAYER {s.layer}") or None,
                 "UNTIL CONVERGED" if s.until_converged else None,
                 (s.max_iters is not None and f"MAX {s.max_iters}") or None,
                 (s.floor is not None and f"FLOOR {_num(s.floor)}") or None,
                 (s.ceiling is not None and f"CEILING {_num(s.ceiling)}") or None)


def _compact(s: ast.CompactStmt) -> str:
    if s.level == "minor":
        return "COMPACT MINOR"
    return _join("COMPACT MAJOR", "FULL" if s.full else None, (s.lambda_ is not None and f"WITH LAMBDA = {_num(s.lambda_)}") or None)


def _show_relations(s: ast.ShowRelationsStmt) -> str:
    return _join("SHOW RELATIONS", (s.layer is not None and f"AT LAYER {s.layer}") or None,
                 "WITH EXAMPLES" if s.with_examples else None, s.mode and s.mode.upper())


def _show_features(s: ast.ShowFeaturesStmt) -> str:
    return _join(f"SHOW FEATURES {s.layer}", _where(s.where) if s.where else None, (s.limit is not None and f"LIMIT {s.limit}") or None)


def _show_entities(s: ast.ShowEntitiesStmt) -> str:
    return _join("SHOW ENTITIES", (s.layer is not None and f"AT LAYER {s.layer}") or None,
                 (s.limit is not None and f"LIMIT {s.limit}") or None)


UNPARSERS: dict[type, Callable[..., str]] = {
    ast.ExtractStmt: _extract, ast.CompileStmt: _compile, ast.DiffStmt: _diff, ast.UseStmt: _use,
    ast.WalkStmt: _walk, ast.DescribeStmt: _describe, ast.SelectStmt: _select, ast.ExplainWalkStmt: _explain_walk,
    ast.ExplainInferStmt: _explain_infer, ast.InferStmt: _infer, ast.TraceStmt: _trace, ast.InsertStmt: _insert,
    ast.CrownStmt: lambda s: _join(f"CROWN {q(s.prompt)} FOR {q(s.expected)}", s.subject and f"SUBJECT {q(s.subject)}"),
    ast.DeleteStmt: lambda s: f"DELETE FROM EDGES {_where(s.where)}", ast.UpdateStmt: _update, ast.MergeStmt: _merge,
    ast.RebalanceStmt: _rebalance, ast.CompactStmt: _compact,
    ast.BeginPatchStmt: lambda s: _join(f"BEGIN PATCH {q(s.path)}", _force(s.force)),
    ast.SavePatchStmt: lambda s: _join("SAVE PATCH", _force(s.force)),
    ast.ApplyPatchStmt: lambda s: f"APPLY PATCH {q(s.path)}", ast.ShowPatchesStmt: lambda s: "SHOW PATCHES",
    ast.RemovePatchStmt: lambda s: f"REMOVE PATCH {q(s.path)}", ast.ShowRelationsStmt: _show_relations,
    ast.ShowLayersStmt: lambda s: _join("SHOW LAYERS", s.range and _range(s.range)),
    ast.ShowFeaturesStmt: _show_features, ast.ShowEntitiesStmt: _show_entities,
    ast.ShowModelsStmt: lambda s: "SHOW MODELS", ast.ShowCompactStatusStmt: lambda s: "SHOW COMPACT STATUS",
    ast.StatsStmt: lambda s: _join("STATS", s.path and q(s.path)),
    ast.UseSaeStmt: lambda s: _join(f"USE SAE {q(s.path)}", (s.layer is not None and f"AT LAYER {s.layer}") or None,
                                    s.labels and f"LABELS {q(s.labels)}"),
    ast.ShowSaesStmt: lambda s: "SHOW SAES",
    ast.SaeFeaturesStmt: lambda s: _join(f"FEATURES {q(s.prompt)}", (s.layer is not None and f"AT LAYER {s.layer}") or None,
                                         (s.top is not None and f"TOP {s.top}") or None,
                                         s.positions and "POSITIONS " + s.positions.upper()),
    ast.SaeFeatureStmt: lambda s: _join("SAE", (s.sae is not None and q(s.sae)) or None, f"FEATURE {s.feature}",
                                        (s.top is not None and f"TOP {s.top}") or None),
    ast.DropSaeStmt: lambda s: f"DROP SAE {q(s.target)}" if s.target is not None else "DROP SAES",
    ast.PipeStmt: lambda s: " |> ".join(unparse(x) for x in s.stages),
}


def unparse(stmt: ast.Statement) -> str:
    """Canonical LQL text for one statement (no trailing ';')."""
    return UNPARSERS[type(stmt)](stmt)
