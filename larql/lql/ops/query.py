"""DESCRIBE, WALK, EXPLAIN WALK, SELECT and the SHOW statements over the vindex in use."""

from __future__ import annotations

import fnmatch
from collections import Counter
from typing import Any

from larql.edit.state.view import EditableVindex
from larql.errors import LqlSemanticError
from larql.lql import ast
from larql.lql.ops.sae_rows import attached, describe_features
from larql.lql.plan import PlanRun
from larql.lql.planner import SELECT_COLUMNS, select_column
from larql.lql.result import Result
from larql.lql.session import Session
from larql.vindex import browse
from larql.vindex.describe import describe as describe_entity


def _v(session: Session) -> EditableVindex:
    assert session.vindex is not None  # the planner checked
    return session.vindex


def _feature_cell(v: EditableVindex, layer: int, feature: int) -> int | str:
    """A feature as a row shows it: its number, or in a mixture-of-experts layer `E2 F17` (expert
    2's feature 17; the number SELECT, DELETE and UPDATE take is 2 x features-per-expert + 17)."""
    return feature if not v.num_experts(layer) else v.feature_name(layer, feature).split(" ", 1)[1]


def _experts_note(v: EditableVindex, result: Result) -> None:
    layer = next((i for i in range(v.num_layers) if v.num_experts(i)), None)
    if layer is not None:
        per = v.num_features(layer) // v.num_experts(layer)
        result.notes.append(f"a mixture of experts ({v.num_experts(layer)} per layer): expert e's feature j is "
                            f"feature e x {per} + j")


def describe(stmt: ast.DescribeStmt, session: Session, result: Result, run: PlanRun) -> None:
    v = _v(session)
    # describe_entity runs these steps as one call; the plan hands it their parameters
    entity = run.take("entity_embedding")["entity"]
    contrastive = run.take("contrastive_query")["contrastive"]
    knn = run.take("gate_knn")
    collect = run.take("collect_edges")
    mode = collect["mode"]
    probe = run.take_if("probe_edges") is not None
    sae_step = run.take_if("sae_features")
    model = (session.model if session.model is not None else v.model()) if probe else None
    card = describe_entity(v, entity, relations_only=collect["relations_only"], mode=mode, model=model, probes=probe,
                           contrastive=contrastive, progress=session.progress, layers=list(knn["layers"]),
                           hits_per_layer=knn["top"], min_gate=collect["min_gate"])
    result.title = entity
    sae_rows: list[list[Any]] = []
    if sae_step is not None:
        m = session.model if session.model is not None else v.model()
        sae_rows = describe_features(m, entity, attached(session, sae_step), sae_step)
    if not card.found and not sae_rows:
        result.notes.append("(not found)")
        return
    result.notes.append(f"signal: {card.signal} ({len(card.edges) - len(card.probes)} feature edges, "
                        f"max gate {card.max_gate:.1f})")
    result.columns = ["section", "relation", "target", "score", "layers"] + (["also"] if mode == "verbose" else [])
    for e in card.probes:
        row: list[Any] = ["probe", e.label, e.target, e.score, "model"]
        result.rows.append(row + ([""] if mode == "verbose" else []))
    for band, edges in card.bands.items():
        lo, hi = card.layer_bands[band]
        for e in edges:
            # cluster labels only in VERBOSE (as LARQL's BRIEF shows only probe-confirmed labels)
            label = (e.label or "") if mode == "verbose" else ""
            layers = f"L{e.layer}" if mode != "verbose" else f"L{min(e.layers)}-{max(e.layers)} {e.hits}x"
            if v.num_experts(e.layer):  # where the strongest hit is: which expert's feature
                layers += f" ({v.feature_name(e.layer, e.feature)})"
            row = [f"{band} L{lo}-{hi}", label, e.target, e.score, layers]
            result.rows.append(row + ([", ".join(e.also)] if mode == "verbose" else []))
    if not result.rows:
        result.notes.append("(no edges found)")
    if sae_rows:  # after the edges: features of the attached SAEs, named by the tokens they write
        result.columns = result.columns or ["section", "relation", "target", "score", "layers"]
        pad = [""] if mode == "verbose" else []
        result.rows += [r + pad for r in sae_rows]


def walk(stmt: ast.WalkStmt, session: Session, result: Result, run: PlanRun) -> None:
    v = _v(session)
    prompt = run.take("tokenize")["prompt"]
    run.take("last_token_embedding")  # browse.walk tokenizes and embeds; the scan below is the step that varies
    knn = run.take("gate_knn")
    w = browse.walk(v, prompt, top=knn["top"], layers=knn["layers"])
    result.title = f"Feature scan for {stmt.prompt!r} (token {w.token!r}, {len(w.layers)} layers)"
    result.columns = ["layer", "feature", "gate", "top", "down"]
    for layer, hits in w.by_layer().items():
        for h in hits:
            result.rows.append([layer, _feature_cell(v, layer, h.feature), h.score, h.top_token,
                                ", ".join(h.down_tokens)])
    result.notes.append("a feature scan of the last token's embedding, not inference: no attention runs")


def explain_walk(stmt: ast.ExplainWalkStmt, session: Session, result: Result, run: PlanRun) -> None:
    v = _v(session)
    prompt = run.take("tokenize")["prompt"]
    run.take("last_token_embedding")
    knn = run.take("gate_knn")
    w = browse.walk(v, prompt, top=knn["top"], layers=knn["layers"], n_down=knn["n_down"])
    result.title = f"EXPLAIN WALK {stmt.prompt!r} (token {w.token!r})"
    result.columns = ["layer", "feature", "top", "gate", "down", "relation"]
    for layer, hits in w.by_layer().items():
        for h in hits:
            label = v.feature_label(layer, h.feature)
            if knn["relations_only"] and not label:
                continue
            result.rows.append([layer, _feature_cell(v, layer, h.feature), h.top_token, h.score,
                                ", ".join(h.down_tokens), label or ""])


# ---- SELECT -------------------------------------------------------------------------------------

def _like(pattern: str, text: str) -> bool:
    return fnmatch.fnmatchcase(text.lower(), pattern.lower().replace("%", "*").replace("_", "?"))


def _match(cond: ast.Condition, value: Any, stmt: ast.Statement, session: Session) -> bool:
    op, want = cond.op, cond.value
    if op == "IN":
        return any(_match(ast.Condition(cond.field, "=", w), value, stmt, session) for w in want)  # type: ignore[union-attr]
    if op == "LIKE":
        return _like(str(want), str(value))
    if isinstance(want, str) != isinstance(value, str):
        raise LqlSemanticError(f"cannot compare {cond.field} ({type(value).__name__}) with {want!r}", session.source,
                               stmt.span.line, stmt.span.column, f"{cond.field} takes a {'string' if isinstance(value, str) else 'number'}")
    if isinstance(value, str):
        value, want = value.lower(), str(want).lower()
    if op == "=":
        return abs(value - want) <= 1e-3 if isinstance(value, float) else value == want  # type: ignore[operator]
    return {"!=": value != want, "<": value < want, ">": value > want, "<=": value <= want,
            ">=": value >= want}[op]


EDGE_FIELDS = {"layer": "layer", "feature": "feature", "target": "token", "token": "token", "top_token": "token",
               "score": "score", "confidence": "score", "c_score": "score", "relation": "relation"}


def filter_rows(rows: list[dict[str, Any]], where: tuple[ast.Condition, ...], fields: dict[str, str],
            stmt: ast.Statement, session: Session) -> list[dict[str, Any]]:
    for cond in where:
        if cond.field == "entity":  # LARQL: entity is a substring of the feature's top output token
            needle = str(cond.value).lower()
            rows = [r for r in rows if (needle in r["token"].lower()) == (cond.op != "!=")] if cond.op in ("=", "!=") \
                else [r for r in rows if _match(cond, r["token"], stmt, session)]
            continue
        key = fields.get(cond.field)
        if key is None:
            raise LqlSemanticError(f"unknown field {cond.field!r} for this source", session.source, stmt.span.line,
                                   stmt.span.column, "fields: entity, " + ", ".join(sorted(fields)))
        rows = [r for r in rows if _match(cond, r[key], stmt, session)]
    return rows


def select(stmt: ast.SelectStmt, session: Session, result: Result, run: PlanRun) -> None:
    v = _v(session)
    if run.take_if("scan_entities") is not None:
        _select_entities(stmt, session, result, run)
        return
    if (emb := run.take_if("entity_embedding")) is not None:
        knn = run.take("gate_knn")
        hits = browse.nearest(v, emb["entity"], knn["layer"], knn["top"])
        result.title = f"nearest to {emb['entity']!r} at layer {knn['layer']}"
    else:
        run.take("scan_" + stmt.source)
        pending = run.peek("filter")  # the scan reads only the layer the filter will keep
        conds = () if pending is None else pending["where"]
        layer = next((c.value for c in conds if c.field == "layer" and c.op == "=" and isinstance(c.value, int)), None)
        hits = list(browse.iter_features(v, None if layer is None else [layer]))
    rows: list[dict[str, Any]]
    rows = [{"layer": h.layer, "feature": h.feature, "token": h.top_token, "also": ", ".join(h.down_tokens[:3]),
             "relation": v.feature_label(h.layer, h.feature) or "", "score": h.score} for h in hits]
    if (where := run.take_if("filter")) is not None:
        rows = filter_rows(rows, where["where"], EDGE_FIELDS, stmt, session)
    if (order := run.take_if("order")) is not None:
        _order(rows, order["field"], order["descending"], stmt, session, EDGE_FIELDS)
    elif stmt.source == "edges" and emb is None:  # NEAREST keeps the KNN order
        rows.sort(key=lambda r: r["score"], reverse=True)
    limit = run.take("limit")["n"]
    _project(stmt, result, rows[:limit])
    if len(rows) > limit:
        result.notes.append(f"{len(rows)} rows, {limit} shown (LIMIT)")
    _experts_note(v, result)


def _select_entities(stmt: ast.SelectStmt, session: Session, result: Result, run: PlanRun) -> None:
    v = _v(session)
    where = run.take_if("filter")
    conds: tuple[ast.Condition, ...] = () if where is None else where["where"]
    layer = next((c.value for c in conds if c.field == "layer" and c.op == "="), None)
    entities = browse.select_entities(v, layer=layer, limit=10**9)  # type: ignore[arg-type]
    rows = [{"token": e.token, "count": e.count, "score": e.max_score} for e in entities]
    fields = {"token": "token", "count": "count", "score": "score", "max_score": "score"}
    rows = filter_rows(rows, tuple(c for c in conds if c.field != "layer"), fields, stmt, session)
    if (order := run.take_if("order")) is not None:
        _order(rows, order["field"], order["descending"], stmt, session, fields)
    limit = run.take("limit")["n"]
    _project(stmt, result, [{"token": r["token"], "count": r["count"], "max_score": r["score"]} for r in rows[:limit]])


def _order(rows: list[dict[str, Any]], field: str, descending: bool, stmt: ast.SelectStmt, session: Session,
           fields: dict[str, str]) -> None:
    key = fields.get(field)
    if key is None:
        raise LqlSemanticError(f"cannot ORDER BY {field!r}", session.source, stmt.span.line,
                               stmt.span.column, "order by " + ", ".join(sorted(fields)))
    rows.sort(key=lambda r: r[key], reverse=descending)


def _project(stmt: ast.SelectStmt, result: Result, rows: list[dict[str, Any]]) -> None:
    """The columns SELECT named (the planner checked them), headed as they were written; * is all."""
    names = list(stmt.fields) or list(SELECT_COLUMNS[stmt.source])
    keys = [select_column(stmt.source, n) or n for n in names]  # never None: the planner checked the names
    result.columns = names
    result.rows = [[r[k] for k in keys] for r in rows]


# ---- SHOW ---------------------------------------------------------------------------------------

def show_layers(stmt: ast.ShowLayersStmt, session: Session, result: Result, run: PlanRun) -> None:
    v = _v(session)
    span = run.take("summarize_layers")["layers"]
    layers = range(v.num_layers) if span is None else range(span[0], span[1] + 1)
    result.columns = ["layer", "band", "features", "top_token", "top_token_count"]
    bands = v.index["layer_bands"]
    for layer in layers:
        ids, _ = v.down_meta(layer)
        top, count = Counter(int(i) for i in ids[:, 0]).most_common(1)[0]
        band = next(b for b, (lo, hi) in bands.items() if lo <= layer <= hi)
        result.rows.append([layer, band, v.num_features(layer), v.token_text(top).strip(), count])


def show_features(stmt: ast.ShowFeaturesStmt, session: Session, result: Result, run: PlanRun) -> None:
    v = _v(session)
    scan = run.take("scan_features")
    rows: list[dict[str, Any]]
    rows = [{"feature": h.feature, "token": h.top_token, "score": h.score, "down": ", ".join(h.down_tokens),
             "relation": v.feature_label(h.layer, h.feature) or ""} for h in browse.iter_features(v, [scan["layer"]])]
    for cond in scan["where"]:  # LARQL: token = "x" (and relation) is a substring match
        key = {"token": "token", "target": "token", "entity": "token", "relation": "relation",
               "confidence": "score", "c_score": "score", "score": "score"}.get(cond.field)
        if key in ("token", "relation") and cond.op in ("=", "!="):
            needle = str(cond.value).lower()
            rows = [r for r in rows if (needle in r[key].lower()) == (cond.op == "=")]
        elif key is not None:
            rows = [r for r in rows if _match(cond, r[key], stmt, session)]
        else:
            raise LqlSemanticError(f"SHOW FEATURES cannot filter on {cond.field!r}", session.source, stmt.span.line,
                                   stmt.span.column, "filter on token, relation or confidence")
    limit = stmt.limit if stmt.limit is not None else v.num_layers
    result.title = f"layer {stmt.layer} features"
    _experts_note(v, result)
    result.columns = ["feature", "token", "score", "down", "relation"]
    result.rows = [[r[c] for c in result.columns] for r in rows[:limit]]


def show_entities(stmt: ast.ShowEntitiesStmt, session: Session, result: Result, run: PlanRun) -> None:
    count = run.take("count_entities")
    entities = browse.select_entities(_v(session), layer=count["layer"], limit=count["limit"])
    result.columns = ["token", "count", "max_score"]
    result.rows = [[e.token, e.count, e.max_score] for e in entities]


def show_relations(stmt: ast.ShowRelationsStmt, session: Session, result: Result, run: PlanRun) -> None:
    v = _v(session)
    read = run.take("read_clusters")
    clusters = v.relation_clusters
    if clusters is None:
        result.notes.append("this vindex has no relation clusters")
        return
    counts = list(clusters["counts"])
    if read["layer"] is not None:  # features of that layer only
        at_layer = Counter(c for (layer, _), c in v.feature_clusters.items() if layer == read["layer"])
        counts = [at_layer.get(c, 0) for c in range(clusters["k"])]
    result.columns = ["relation", "features"] + (["examples"] if read["examples"] else [])
    order = [c for c in sorted(range(clusters["k"]), key=lambda c: -counts[c]) if counts[c]]
    for c in order[: read["limit"]]:
        row: list[Any] = [clusters["labels"][c], counts[c]]
        if read["examples"]:
            row.append(", ".join(clusters["top_tokens"][c]))
        result.rows.append(row)
