"""Statement -> Plan: the steps a statement will run, with semantic checks against the session.

A plan's `to_text()` is deterministic (golden-tested) and is what `larql lql --plan` prints; each
step's `params` are what its handler reads (lql/plan.py), written here from the same values as
the text, so the plan is what runs. Semantic errors (no vindex in use, a layer out of range, model weights needed on a browse-only
vindex, a refused clause) are raised here, before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from larql.edit.methods.defaults import (
    N_NEIGHBOURS,
    N_PREFIXES,
    NEURONS_PER_LAYER,
    default_layer,
    default_method,
    is_key_of,
    neuron_layers,
    subject_keys,
)
from larql.errors import LqlSemanticError
from larql.lql import ast
from larql.lql.clauses import refusal
from larql.lql.paths import check as check_paths
from larql.lql.plan import Plan, Step
from larql.lql.plan_maintenance import maintenance_steps
from larql.lql.plan_sae import (
    describe_sae_step,
    drop_sae_steps,
    explain_sae_step,
    sae_feature_steps,
    sae_features_steps,
    show_saes_steps,
    steer_step,
    use_sae_steps,
)
from larql.lql.unparse import unparse
from larql.vindex.layout import DESCRIBE_HITS_PER_LAYER, DESCRIBE_MIN_GATE, describe_layers

if TYPE_CHECKING:
    from larql.lql.session import Session


NEEDS_NOTHING = (ast.UseStmt, ast.ExtractStmt, ast.ShowModelsStmt, ast.ShowSaesStmt, ast.DropSaeStmt)

# SELECT's columns per source, and the other names LARQL accepts for some of them (column -> row key)
SELECT_COLUMNS = {"edges": ("layer", "feature", "token", "also", "relation", "score"),
                  "features": ("layer", "feature", "token", "also", "relation", "score"),
                  "entities": ("token", "count", "max_score")}
COLUMN_ALIASES = {"edges": {"target": "token", "top_token": "token", "confidence": "score", "c_score": "score"},
                  "entities": {"score": "max_score"}}
COLUMN_ALIASES["features"] = COLUMN_ALIASES["edges"]


def select_column(source: str, name: str) -> str | None:
    """The column `name` means in SELECT ... FROM `source` (an alias resolved), or None."""
    name = name.lower()
    if name in SELECT_COLUMNS[source]:
        return name
    return COLUMN_ALIASES.get(source, {}).get(name)


def _error(session: Session, stmt: ast.Statement, message: str, hint: str = "") -> LqlSemanticError:
    span = stmt.span
    return LqlSemanticError(message, session.source, span.line, span.column, hint)


def _check_layer(session: Session, stmt: ast.Statement, layer: int | None) -> None:
    v = session.vindex
    if layer is not None and v is not None and not 0 <= layer < v.num_layers:
        raise _error(session, stmt, f"layer {layer} is out of range: this vindex has layers 0-{v.num_layers - 1}",
                     f"use a layer between 0 and {v.num_layers - 1}")


def _check_range(session: Session, stmt: ast.Statement, r: ast.Range | str | None) -> None:
    if isinstance(r, ast.Range):
        _check_layer(session, stmt, r.start)
        _check_layer(session, stmt, r.end)


def insert_steps(stmt: ast.InsertStmt, session: Session) -> list[Step]:
    """The steps INSERT takes for its method; ops/editing.py reads the method, layers and goal here."""
    v = session.vindex
    assert v is not None  # the planner checked
    method = stmt.method or default_method(v.index["model"])
    n = len(stmt.rows)
    facts = tuple(stmt.values(i) for i in range(n))  # entity, relation, target[, prompt] per row
    if "key" in stmt.columns and method != "neuron":
        raise _error(session, stmt, f"the key column is METHOD NEURON's (this INSERT is METHOD {method.upper()})",
                     "add METHOD NEURON, or leave the key column out")
    if method == "feature":
        alone = n == 1 and "prompt" not in stmt.columns  # LARQL's INSERT, with its own report
        goal = stmt.confidence or 0.9
        return [Step("capture", "FFN inputs at the install layer: the prompt and decoys",
                     {"layer": stmt.layer, "facts": facts}),
                Step("choose_slot", "least-used feature"), Step("install", "gate/up orthogonal to the decoys"),
                Step("search_down_scale", f"until p(target) >= {goal}", {"goal": goal}),
                Step("measure", "target probability, neighbours' KL" if alone
                     else "held-out prompts: prefixed prompt, unrelated prompts' top-1 and KL", {"alone": alone}),
                Step("record", f"patch overlay, {n} feature insert(s)", {"method": method})]
    if stmt.layers is not None:
        _check_range(session, stmt, stmt.layers)
        layers = list(range(stmt.layers.start, stmt.layers.end + 1))
    else:
        layers = [stmt.layer if stmt.layer is not None else default_layer(v.index["model"], v.num_layers)]
    where = f"layers {layers[0]}-{layers[-1]}" if len(layers) > 1 else f"layer {layers[0]}"
    if method == "neuron":
        from larql.edit.state.edited import neuron_subjects  # numpy: an INSERT's session has the vindex open already

        entities = [f["entity"] for f in facts]
        keys = ({e: k for e, k in subject_keys([*entities, *neuron_subjects(v)]).items() if e in entities}
                | {f["entity"]: f["key"] for f in facts if f.get("key")})
        for f in facts:
            entity, key = f["entity"], keys[f["entity"]]
            if not is_key_of(key, entity):
                raise _error(session, stmt, f"the key {key!r} is not the leading words of the entity {entity!r}",
                             f"give whole words the entity starts with, e.g. {entity.split()[0]!r}")
        chosen: list[int] | None = layers
        if stmt.layers is None and stmt.layer is None:  # filled in order, NEURONS_PER_LAYER each
            chosen = None
            order = neuron_layers(v.index["model"], v.num_layers)
            where = (f"layer {order[0]}" if len(order) == 1 else
                     f"layer {order[0]}, then {', '.join(map(str, order[1:]))} ({NEURONS_PER_LAYER} neurons each)")
        elif len(layers) > 1:
            where += " (subjects spread evenly)"
        return [Step("statistics", f"E[x x^T] of the MLP's input at {where} (cached beside the vindex, "
                                   "else computed)", {"layers": chosen}),
                Step("capture", f"the MLP's input at the subject's last token, prompt + {N_PREFIXES} model-written "
                                "prefixes, and opening a text; subjects that end in the same words as another "
                                "(this statement's or one already edited) at their name's last token, or at the key given"
                                + "".join(f"; {s!r} at {k!r}" for s, k in keys.items() if k != s),
                     {"facts": facts, "keys": keys}),
                Step("optimise_value", f"Adam through layers {layers[0]}.. (hand-written backward), at most 25 steps"),
                Step("hold_inputs", f"BOS, decoy subjects, each subject's {N_NEIGHBOURS} nearest subjects and known "
                                    "objects (probes), the old object; the other and earlier neurons' subjects"),
                Step("add_feature", "per subject, one feature appended to the layer (numbered from its width up; "
                                    "no feature of the model changes)"),
                Step("solve", "per subject, g of least E[x x^T]-norm: 1 at the subject, 0 where held (its own "
                              "holds, the nearest other subjects and wherever it would fire above 0.05); "
                              "gate = 12 g, up = g, down = value / f(12)"),
                Step("record", f"patch overlay, {n} neuron insert(s) (method neuron)", {"method": method}),
                Step("settle", "each layer once recorded, lowest first: every subject's texts (itself, its prompts, "
                               "two of the batch's templates) re-read through the edited model; a neuron opening "
                               "on another subject's text (g.x > 0.5) is held there with the least change of g "
                               "(thresholded neurons only)"),
                Step("measure", "held-out prompts: prefixed prompt, unrelated prompts' top-1 and KL")]
    solve = "one joint solve" if method == "memit" else f"{n} solve(s), one fact after another"
    return [Step("statistics", f"E[k k^T] at {where} (cached beside the vindex, else computed)", {"layers": layers}),
            Step("capture", f"keys at the subject's last token, prompt + {N_PREFIXES} model-written prefixes",
                 {"facts": facts}),
            Step("optimise_value", f"Adam through layers {layers[0]}.. (hand-written backward), at most 25 steps"),
            Step("hold_keys", f"BOS, decoy subjects, each subject's {N_NEIGHBOURS} nearest subjects and known objects "
                              "(probes), the old object, earlier edits at the layer"),
            Step("solve", f"minimum C-norm update of W_down at {where}: {solve}"),
            Step("record", f"patch overlay, weight_edit (method {method})", {"method": method}),
            Step("measure", "held-out prompts: prefixed prompt, unrelated prompts' top-1 and KL")]


# what a statement needs before it is planned, beyond a vindex in use: model weights (the label, the hint)
NEEDS_WEIGHTS = {ast.InsertStmt: ("INSERT", "extract it WITH INFERENCE: the fact is installed by running the model"),
                 ast.RebalanceStmt: ("REBALANCE", "extract it WITH INFERENCE: each fact's probability is measured "
                                                  "by running the model")}
# statements that run the model: a USE MODEL session needs no vindex, a browse-level vindex cannot run them
RUNS_MODEL = {ast.InferStmt: "INFER", ast.TraceStmt: "TRACE", ast.ExplainInferStmt: "EXPLAIN INFER",
              ast.CrownStmt: "CROWN", ast.UseSaeStmt: "USE SAE", ast.SaeFeaturesStmt: "FEATURES",
              ast.SaeFeatureStmt: "SAE FEATURE"}
# the defaults statements take when a clause is left out, one place for each
DEFAULTS = {"infer_top": 5, "select_limit": 20, "select_entities_limit": 50, "show_entities_limit": 50,
            "show_relations_limit": 30, "show_relations_verbose_limit": 50, "diff_limit": 20,
            "explain_infer_top": 3, "explain_infer_verbose_top": 10}

StepsFn = Callable[[Any, "Session"], list[Step]]


def plan(stmt: ast.Statement, session: Session) -> Plan:
    """Check `stmt` against the session and list its steps (each statement type's function in STEPS)."""
    if isinstance(stmt, ast.PipeStmt):
        return Plan(stmt, tuple(Step("run", unparse(s), {"statement": s}) for s in stmt.stages))
    _check_preconditions(stmt, session)
    check_paths(stmt, session)  # never into what it reads, nor over an output without FORCE
    steps_of = STEPS.get(type(stmt))
    if steps_of is None:  # pragma: no cover - every statement type has its function
        raise _error(session, stmt, f"cannot plan {type(stmt).__name__}")
    steps = steps_of(stmt, session)
    if getattr(stmt, "force", False):
        steps.append(Step("replace_existing", "FORCE: an existing output is replaced (only once the new one is complete)",
                          {"force": True}))
    return Plan(stmt, tuple(steps))


def _check_preconditions(stmt: ast.Statement, session: Session) -> None:
    """Refused clauses, and what the session must have: a vindex in use, model weights."""
    refused = refusal(stmt)
    if refused is not None:
        raise _error(session, stmt, refused.message, refused.hint)
    if isinstance(stmt, ast.DiffStmt) and stmt.relation is not None:
        raise _error(session, stmt, "DIFF ... RELATION is not supported: differences are per feature, not per relation",
                     'filter by layer: DIFF "a.vindex" "b.vindex" LAYER 12')
    v = session.vindex
    needs = NEEDS_WEIGHTS.get(type(stmt))
    if needs is not None and v is not None and not v.has_model_weights:
        raise _error(session, stmt, f"{needs[0]} needs model weights, and the vindex in use is browse-level", needs[1])
    runs_model = RUNS_MODEL.get(type(stmt))
    if runs_model and session.model is None and v is not None and not v.has_model_weights:
        raise _error(session, stmt, f"{runs_model} needs model weights, and the vindex in use "
                     f"is browse-level", 'extract it WITH INFERENCE, or USE MODEL "gemma3-270m"')
    needs_vindex = not (isinstance(stmt, NEEDS_NOTHING) or (isinstance(stmt, ast.StatsStmt) and stmt.path)
                        or (isinstance(stmt, ast.CompileStmt) and stmt.source is not None)
                        or (isinstance(stmt, ast.DiffStmt) and stmt.a is not None and stmt.b is not None)
                        or (runs_model and session.model is not None))
    if needs_vindex and v is None:
        raise _error(session, stmt, "no vindex in use", 'run USE "path/to.vindex" (or EXTRACT ... INTO) first')


def _use(stmt: ast.UseStmt, session: Session) -> list[Step]:
    op = {"vindex": "open_vindex", "model": "load_model", "remote": "connect"}[stmt.kind]
    return [Step(op, stmt.target, {"target": stmt.target})]


def _extract(stmt: ast.ExtractStmt, session: Session) -> list[Step]:
    return [Step("load_model", stmt.model, {"model": stmt.model}),
            Step("extract", f"level={stmt.level} into {stmt.into}", {"level": stmt.level, "into": stmt.into}),
            Step("use", stmt.into, {"path": stmt.into})]


def _stats(stmt: ast.StatsStmt, session: Session) -> list[Step]:
    return [Step("read_index", stmt.path or "the vindex in use", {"path": stmt.path})]


def _show_models(stmt: ast.ShowModelsStmt, session: Session) -> list[Step]:
    return [Step("scan_directory", ".", {"directory": "."})]


def _describe(stmt: ast.DescribeStmt, session: Session) -> list[Step]:
    _check_layer(session, stmt, stmt.at_layer)
    v = session.vindex
    assert v is not None  # checked above
    where = f"layer {stmt.at_layer}" if stmt.at_layer is not None else f"band {stmt.band or 'all'}"
    mode = stmt.mode or "brief"
    steps = [Step("entity_embedding", repr(stmt.entity), {"entity": stmt.entity}),
             Step("contrastive_query", "minus common-word baseline", {"contrastive": True}),
             Step("gate_knn", f"{where}, top {DESCRIBE_HITS_PER_LAYER} per layer",
                  {"layers": describe_layers(v.index["layer_bands"], v.num_layers, stmt.band, stmt.at_layer),
                   "top": DESCRIBE_HITS_PER_LAYER}),
             Step("collect_edges", f"gate >= {DESCRIBE_MIN_GATE:g}, content tokens, mode={mode}",
                  {"min_gate": DESCRIBE_MIN_GATE, "mode": mode, "relations_only": stmt.relations_only})]
    if v.has_model_weights:
        steps.append(Step("probe_edges", "relation templates through the model"))
    if session.model is not None or v.has_model_weights:
        chosen = [stmt.at_layer] if stmt.at_layer is not None else None
        if chosen is None and stmt.band is not None:
            chosen = describe_layers(v.index["layer_bands"], v.num_layers, stmt.band, None)
        steps += describe_sae_step(session, chosen)
    return steps


def _walk(stmt: ast.WalkStmt | ast.ExplainWalkStmt, session: Session) -> list[Step]:
    _check_range(session, stmt, stmt.layers)
    top = stmt.top or walk_top(stmt)
    span = _walk_span(stmt, session)
    where = _layers_text(stmt.layers) if span is None or stmt.layers is not None \
        else f"{span[0]}-{span[1]} (band {getattr(stmt, 'band', '')})"
    knn: dict[str, object] = {"layers": span, "top": top}
    if isinstance(stmt, ast.ExplainWalkStmt):
        knn |= {"n_down": 5 if stmt.verbose else 3, "relations_only": stmt.relations_only}
    return [Step("tokenize", repr(stmt.prompt), {"prompt": stmt.prompt}),
            Step("last_token_embedding", "scaled"),
            Step("gate_knn", f"layers {where}, top {top} per layer", knn)]


def _infer(stmt: ast.InferStmt, session: Session) -> list[Step]:
    dense = session.model is not None
    ffn = "dense FFN (the model in use)" if dense else "walk FFN: vindex weights + patch overlay"
    top = stmt.top or DEFAULTS["infer_top"]
    steps = [Step("tokenize", repr(stmt.prompt), {"prompt": stmt.prompt}), *steer_step(stmt, session),
             Step("forward", f"{ffn}, KV cache", {"ffn": "dense" if dense else "walk"}),
             Step("top_k", str(top), {"k": top})]
    if stmt.compare:
        steps.append(Step("compare_dense", "dense FFN forward: top-k side by side, KL(dense || walk)"))
    return steps


def _explain_infer(stmt: ast.ExplainInferStmt, session: Session) -> list[Step]:
    _check_range(session, stmt, stmt.layers)
    read = _infer_layers(stmt, session)
    layers = _layers_text(stmt.layers) if stmt.layers is not None else f"band {stmt.band or 'all'}"
    if stmt.layers is None and read is not None:  # a band: the layers it resolved to
        layers = f"{read[0]}-{read[-1]} (band {stmt.band})"
    elif stmt.layers is None and stmt.band not in (None, "all"):
        layers = "all (bands are a vindex's; USE MODEL has none)"
    which = "labelled features only" if stmt.relations_only else "every feature"
    k = stmt.top or DEFAULTS["explain_infer_verbose_top" if stmt.verbose else "explain_infer_top"]
    steps = [Step("tokenize", repr(stmt.prompt), {"prompt": stmt.prompt}),
             Step("run_with_cache", f"mlp.hook_post (and hook_resid_mid where NEURON added features), layers {layers}",
                  {"layers": read}),
             Step("top_features", f"{k} per layer by |activation|, {which}",
                  {"k": k, "relations_only": stmt.relations_only, "n_down": 5 if stmt.verbose else 3})]
    if stmt.with_attention:
        steps.append(Step("attention_and_lens", "top-3 attended tokens, logit-lens top-1", {"attended": 3}))
    return steps + explain_sae_step(session, read, stmt.top)


def _show_layers(stmt: ast.ShowLayersStmt, session: Session) -> list[Step]:
    _check_range(session, stmt, stmt.range)
    span = None if stmt.range is None else (stmt.range.start, stmt.range.end)
    return [Step("summarize_layers", _layers_text(stmt.range), {"layers": span})]


def _show_features(stmt: ast.ShowFeaturesStmt, session: Session) -> list[Step]:
    _check_layer(session, stmt, stmt.layer)
    v = session.vindex
    assert v is not None
    return [Step("scan_features", f"layer {stmt.layer}", {
        "layer": stmt.layer, "where": stmt.where, "limit": stmt.limit if stmt.limit is not None else v.num_layers})]


def _show_entities(stmt: ast.ShowEntitiesStmt, session: Session) -> list[Step]:
    _check_layer(session, stmt, stmt.layer)
    return [Step("count_entities", "all layers" if stmt.layer is None else f"layer {stmt.layer}",
                 {"layer": stmt.layer, "limit": stmt.limit or DEFAULTS["show_entities_limit"]})]


def _show_relations(stmt: ast.ShowRelationsStmt, session: Session) -> list[Step]:
    _check_layer(session, stmt, stmt.layer)
    limit = DEFAULTS["show_relations_verbose_limit" if stmt.mode == "verbose" else "show_relations_limit"]
    return [Step("read_clusters", "relation_clusters.json",
                 {"layer": stmt.layer, "examples": stmt.with_examples, "limit": limit})]


def _insert(stmt: ast.InsertStmt, session: Session) -> list[Step]:
    _check_layer(session, stmt, stmt.layer)
    return insert_steps(stmt, session)


def _crown(stmt: ast.CrownStmt, session: Session) -> list[Step]:
    n = session.vindex.num_layers if session.vindex is not None else 0
    steps = [Step("tokenize", repr(stmt.prompt), {"prompt": stmt.prompt}),
             Step("baseline", f"p({stmt.expected!r}) at the last position", {"expected": stmt.expected}),
             Step("ablate_mlp_out", f"each of {n or 'the'} layers at the last position", {"site": "last"})]
    if stmt.subject:
        steps.append(Step("ablate_mlp_out", f"each layer at the last token of {stmt.subject!r}",
                          {"site": "subject", "subject": stmt.subject}))
    steps.append(Step("crown", "the layer whose ablation lowers p most, per site"))
    return steps


def _delete_or_update(stmt: ast.DeleteStmt | ast.UpdateStmt, session: Session) -> list[Step]:
    steps = [Step("scan_edges", "down_meta (with the overlay)")]
    if stmt.where:
        steps.append(Step("filter", _where_text(stmt.where), {"where": stmt.where}))
    kind = "delete" if isinstance(stmt, ast.DeleteStmt) else "metadata update"
    steps.append(Step("record", kind, {"kind": kind, "set": getattr(stmt, "assignments", ())}))
    return steps


def _diff(stmt: ast.DiffStmt, session: Session) -> list[Step]:
    a, b = stmt.a or "CURRENT", stmt.b or "CURRENT"
    _check_layer(session, stmt, stmt.layer)
    limit = DEFAULTS["diff_limit"] if stmt.limit is None else stmt.limit
    steps = [Step("compare_features", f"{a} vs {b}: gate / up / down / down_meta, "
                  f"{'layer ' + str(stmt.layer) if stmt.layer is not None else 'every layer'}",
                  {"a": stmt.a, "b": stmt.b, "layer": stmt.layer, "limit": limit}),
             Step("compare_dense", "tensors outside the FFN (a patch cannot carry them)")]
    if stmt.into_patch:
        steps.append(Step("write_patch", f"{stmt.into_patch}: applied to {a}, gives {b}", {"path": stmt.into_patch}))
    return steps


def _maintenance(stmt: ast.Statement, session: Session) -> list[Step]:
    if isinstance(stmt, ast.RebalanceStmt):
        _check_layer(session, stmt, stmt.layer)
    return maintenance_steps(stmt)


PATCH_STEPS = {ast.BeginPatchStmt: "begin_patch", ast.SavePatchStmt: "save_patch", ast.ApplyPatchStmt: "apply_patch",
               ast.RemovePatchStmt: "remove_patch", ast.ShowPatchesStmt: "show_patches"}


def _patch(stmt: ast.Statement, session: Session) -> list[Step]:
    path = getattr(stmt, "path", "")
    return [Step(PATCH_STEPS[type(stmt)], path, {"path": path})]


def _where_text(where: tuple[ast.Condition, ...]) -> str:
    return " AND ".join(f"{c.field} {c.op} {c.value!r}" for c in where)


def _select_steps(stmt: ast.SelectStmt, session: Session) -> list[Step]:
    for name in stmt.fields:
        if select_column(stmt.source, name) is None:
            raise _error(session, stmt, f'unknown column "{name}"; columns are '
                         + ", ".join(SELECT_COLUMNS[stmt.source]), "SELECT * shows them all")
    limit = stmt.limit if stmt.limit is not None else DEFAULTS["select_entities_limit" if stmt.source == "entities"
                                                               else "select_limit"]
    if stmt.nearest is not None:
        _check_layer(session, stmt, stmt.nearest.layer)
        steps = [Step("entity_embedding", repr(stmt.nearest.entity), {"entity": stmt.nearest.entity}),
                 Step("gate_knn", f"layer {stmt.nearest.layer}, top {stmt.limit or DEFAULTS['select_limit']}",
                      {"layer": stmt.nearest.layer, "top": stmt.limit or DEFAULTS["select_limit"]})]
    else:
        steps = [Step("scan_" + stmt.source, "down_meta", {"source": stmt.source})]
    if stmt.where:  # NEAREST's hits are filtered and ordered too
        steps.append(Step("filter", _where_text(stmt.where), {"where": stmt.where}))
    if stmt.order:
        steps.append(Step("order", f"{stmt.order.field} {'DESC' if stmt.order.descending else 'ASC'}",
                          {"field": stmt.order.field, "descending": stmt.order.descending}))
    steps.append(Step("limit", str(limit), {"n": limit}))
    return steps


def _trace_steps(stmt: ast.TraceStmt, session: Session) -> list[Step]:
    _check_range(session, stmt, stmt.layers)
    if stmt.save is not None and stmt.positions != "all":
        raise _error(session, stmt, "TRACE ... SAVE needs POSITIONS ALL", f'TRACE "..." POSITIONS ALL SAVE "{stmt.save}"')
    steps = [Step("tokenize", repr(stmt.prompt), {"prompt": stmt.prompt})]
    if stmt.save is not None:
        steps += [Step("capture_trace", "every position's residual chain, every stage"),
                  Step("write_trace", f"{stmt.save} (atomic)", {"path": stmt.save})]
    span = None if stmt.layers is None else (stmt.layers.start, stmt.layers.end)
    steps.append(Step("run_with_cache", f"embedding + resid pre / mid / post, layers {_layers_text(stmt.layers)}",
                      {"layers": span}))
    if stmt.for_token:
        steps.append(Step("attribute", f"each layer's attn / ffn write onto the logit of {stmt.for_token!r}",
                          {"token": stmt.for_token}))
    what = "rank and p of the target" if stmt.for_token else ("|attn| / |ffn| per layer" if stmt.decompose
                                                              else "top-1 per layer")
    steps.append(Step("logit_lens", f"{what}, positions {stmt.positions or 'last'}",
                      {"positions": stmt.positions or "last", "decompose": stmt.decompose}))
    return steps


def _compile_steps(stmt: ast.CompileStmt, session: Session) -> list[Step]:
    fmt = model_format(stmt) if stmt.target == "model" else "vindex"
    if stmt.dtype is not None and fmt == "gguf":
        raise _error(session, stmt, "DTYPE applies to FORMAT SAFETENSORS: a GGUF keeps every tensor's stored "
                     "encoding", f'drop DTYPE, or write an HF directory: INTO MODEL "dir" FORMAT SAFETENSORS '
                     f'DTYPE {stmt.dtype.upper()}')
    steps = [Step("bake_overlay", f"{stmt.source or 'CURRENT'} -> {stmt.into}",
                  {"source": stmt.source, "into": stmt.into, "format": fmt})]
    if fmt == "safetensors":
        steps.append(Step("write_model", f"format safetensors, dtype {stmt.dtype or 'bf16'}",
                          {"format": fmt, "dtype": stmt.dtype or "bf16"}))
    elif fmt == "gguf":
        steps.append(Step("write_model", "format gguf, every tensor in its stored encoding", {"format": fmt}))
    policy = stmt.on_conflict or "last_wins"
    steps.append(Step("write_atomic", f"on conflict {policy}", {"on_conflict": policy}))
    return steps


def _walk_span(stmt: ast.WalkStmt | ast.ExplainWalkStmt, session: Session) -> tuple[int, int] | None:
    """The layers WALK scans: LAYERS a-b, else EXPLAIN WALK's band, else None (every layer)."""
    if isinstance(stmt.layers, ast.Range):
        return stmt.layers.start, stmt.layers.end
    band = getattr(stmt, "band", None)
    if band not in (None, "all") and session.vindex is not None:
        lo, hi = session.vindex.index["layer_bands"][band]
        return lo, hi
    return None


def _infer_layers(stmt: ast.ExplainInferStmt, session: Session) -> list[int] | None:
    """The layers EXPLAIN INFER reads: LAYERS a-b (clipped to the model), else the band's, else None (all)."""
    v, m = session.vindex, session.model
    n = m.config.n_layers if m is not None else v.num_layers if v is not None else None
    if stmt.layers is not None:
        end = stmt.layers.end if n is None else min(stmt.layers.end, n - 1)
        return list(range(stmt.layers.start, end + 1))
    if stmt.band not in (None, "all") and v is not None:
        lo, hi = v.index["layer_bands"][stmt.band]
        return list(range(lo, hi + 1))
    return None


def walk_top(stmt: ast.WalkStmt | ast.ExplainWalkStmt) -> int:
    """Features per layer WALK shows without TOP (EXPLAIN WALK: 10 VERBOSE, else 5)."""
    if isinstance(stmt, ast.ExplainWalkStmt):
        return 10 if stmt.verbose else 5
    return 3


def model_format(stmt: ast.CompileStmt) -> str:
    """FORMAT as written, else from the target: a .gguf file is GGUF, anything else an HF directory."""
    return stmt.format or ("gguf" if stmt.into.lower().endswith(".gguf") else "safetensors")


def _layers_text(r: ast.Range | str | None) -> str:
    if r is None or r == "all":
        return "all"
    assert isinstance(r, ast.Range)
    return f"{r.start}-{r.end}"


# each statement type's steps
STEPS: dict[type, StepsFn] = {
    ast.UseStmt: _use, ast.ExtractStmt: _extract, ast.StatsStmt: _stats, ast.ShowModelsStmt: _show_models,
    ast.DescribeStmt: _describe, ast.WalkStmt: _walk, ast.ExplainWalkStmt: _walk,
    ast.SelectStmt: _select_steps,
    ast.InferStmt: _infer, ast.ExplainInferStmt: _explain_infer,
    ast.TraceStmt: _trace_steps,
    ast.ShowLayersStmt: _show_layers, ast.ShowFeaturesStmt: _show_features, ast.ShowEntitiesStmt: _show_entities,
    ast.ShowRelationsStmt: _show_relations, ast.InsertStmt: _insert, ast.CrownStmt: _crown,
    ast.DeleteStmt: _delete_or_update, ast.UpdateStmt: _delete_or_update,
    ast.CompileStmt: _compile_steps, ast.DiffStmt: _diff,
    ast.UseSaeStmt: use_sae_steps, ast.ShowSaesStmt: show_saes_steps, ast.DropSaeStmt: drop_sae_steps,
    ast.SaeFeaturesStmt: sae_features_steps, ast.SaeFeatureStmt: sae_feature_steps,
    **dict.fromkeys((ast.MergeStmt, ast.RebalanceStmt, ast.CompactStmt, ast.ShowCompactStatusStmt), _maintenance),
    **dict.fromkeys(PATCH_STEPS, _patch),
}
