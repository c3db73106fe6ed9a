"""INSERT, DELETE, UPDATE and the patch statements: edits go to the vindex's overlay (never its
files) and are recorded on its patch stack until SAVE PATCH writes them out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from larql.edit.measure.features import TOP_K, FeatureChange, FeatureShift
from larql.edit.methods import feature as feature_method
from larql.edit.patches.overlay import MetaOverride
from larql.edit.patches.patch import PatchOp
from larql.edit.state.view import EditableVindex
from larql.errors import EmptyTargetError, LqlSemanticError, VindexError
from larql.lql import ast
from larql.lql.ops.query import EDGE_FIELDS, filter_rows
from larql.lql.plan import PlanRun
from larql.lql.result import Result
from larql.lql.session import Session
from larql.model.targets import first_target_token
from larql.vindex import browse

if TYPE_CHECKING:
    from larql.edit.insert import InsertReport


def _v(session: Session) -> EditableVindex:
    assert session.vindex is not None  # the planner checked
    return session.vindex


def _fail(session: Session, stmt: ast.Statement, message: str, hint: str = "") -> LqlSemanticError:
    return LqlSemanticError(message, session.source, stmt.span.line, stmt.span.column, hint)


def insert(stmt: ast.InsertStmt, session: Session, result: Result, run: PlanRun) -> None:
    v = _v(session)
    method = run.param("record", "method")
    if method != "feature" or not run.param("measure", "alone"):
        _insert_facts(stmt, session, result, run, method)
        return
    capture = run.take("capture")
    (fact,) = capture["facts"]
    run.take("choose_slot")
    run.take("install")
    goal = run.take("search_down_scale")["goal"]
    run.take("measure")
    run.take("record")  # feature_method.insert runs the steps above as one call
    # a failure is located by the executor, at the step running (record: the call runs them all)
    try:
        r = feature_method.insert(v, fact["entity"], fact["relation"], fact["target"], capture["layer"], goal)
    except (VindexError, EmptyTargetError) as e:
        raise _fail(session, stmt, str(e)) from e
    result.title = f"Inserted {r.entity} -[{r.relation}]-> {r.target} at {v.feature_name(r.layer, r.feature)} (patch overlay)"
    result.columns = ["measure", "before", "after"]
    result.rows = [
        [f"p({r.target_token.strip()!s} | {r.prompt!r})", r.p_before, r.p_after],
        ["rank of the target", r.rank_before, r.rank_after],
        *([[f"p({r.target_token.strip()!s} | the few-shot form)", r.p_paraphrase_before,
            r.p_paraphrase_after]] if r.paraphrase and r.p_paraphrase_after is not None else []),
        [f"neighbours keeping their top-1 (of {r.locality_total})", r.locality_total, r.locality_top1],
        ["neighbours' mean KL(before || after)", 0.0, r.locality_kl],
    ]
    if r.p_after < goal:
        result.notes.append(f"the goal p >= {goal} was not reached at layer {r.layer}; a later layer "
                            f"(AT LAYER n) usually reaches it")
    recording_note(v, result)


def _insert_facts(stmt: ast.InsertStmt, session: Session, result: Result, run: PlanRun, method: str) -> None:
    """INSERT of one or many facts by a weight edit (ROME / MEMIT) or by features, per row."""
    from larql.edit.insert import insert_facts
    from larql.edit.methods.facts import Fact

    v = _v(session)
    if method == "feature":
        layer = run.param("capture", "layer")
        layers = None if layer is None else [layer]
    else:
        chosen = run.param("statistics", "layers")  # None: METHOD NEURON fills the model's neuron layers
        layers = None if chosen is None else list(chosen)
    rows = run.param("capture", "facts")
    # insert_facts runs every step of the plan in one call, in the plan's order
    for step in run.plan.steps[len(run.taken):]:
        if step.op != "replace_existing":
            run.take(step.op)
    facts = []
    for row in rows:
        prompt = row.get("prompt") or feature_method.relation_prompt(row["entity"], row["relation"])
        facts.append(Fact(row["entity"], prompt, row["target"], row["relation"], key=row.get("key") or None))
    r = insert_facts(v, facts, method, layers, progress=session.progress,
                     saes=[a.sae for a in session.saes.values()])
    insert_result(r, result, {h: a.labels for h, a in session.saes.items()})
    recording_note(v, result)


def insert_result(r: InsertReport, result: Result, labels: Mapping[str, Mapping[int, str]] | None = None) -> None:
    """The table an INSERT of facts shows (LQL and `larql edit` / `larql memit`); `labels`: per SAE
    hook, its features' labels (USE SAE ... LABELS) for the feature-level notes."""
    facts = r.facts
    method = r.method
    how = {"rome": "ROME weight edit", "memit": "MEMIT weight edit (one joint solve)", "feature": "feature insert",
           "neuron": "one subject-keyed neuron per subject"}
    result.title = (f"Inserted {len(facts)} fact(s) by {how[method]} at L{', L'.join(map(str, r.layers))} "
                    f"(patch overlay, {r.ops} operation(s), {r.seconds:.1f} s)")
    result.columns = ["fact", "p(target) before", "after", "top-1 after", "held-out p before", "held-out p after",
                      "held-out top-1"]
    result.rows = [[f.fact.label, f.p_before, f.p_after, "yes" if f.top1_after else "no", f.held_out_before,
                    f.held_out_after, f.held_out_top1] for f in r.facts]
    result.notes.append(f"unrelated prompts keeping their top-1: {r.unrelated_kept} of {r.unrelated_total}, "
                        f"mean KL(before || after) {r.unrelated_kl:.4f}")
    if r.relations:
        result.notes.append(f"the subjects' other relations (DESCRIBE's probes) keeping their answer: "
                            f"{r.relations_kept} of {len(r.relations)} ("
                            + ", ".join(f"{c.subject} {c.relation} {c.before}"
                                        + ("" if c.kept else f" -> {c.after or '?'}") for c in r.relations[:8])
                            + (", ..." if len(r.relations) > 8 else "") + ")")
    result.notes += [feature_note(f, (labels or {}).get(f.hook, {})) for f in r.features]
    result.notes.append("held out: the prompt behind model-written prefixes the edit never saw; p is the whole "
                        "target's probability (every token)")
    result.notes += r.notes


def feature_note(f: FeatureShift, labels: Mapping[int, str]) -> str:
    """One SAE's line of an INSERT's notes: the features that rose and fell on the edited prompts, and
    how much of the unrelated prompts' strongest features stayed."""
    if f.edited_change == 0 and f.unrelated_change == 0:
        return f"SAE features at {f.hook}: unchanged (the hook point reads the model before the edit's layers)"

    def named(c: FeatureChange) -> str:
        name = labels.get(c.feature) or (" ".join(repr(t) for t in c.tokens) if c.tokens else "")
        return f"{c.feature}{f' ({name})' if name else ''} {c.before:.2f} -> {c.after:.2f}"

    parts = [f"rose {', '.join(map(named, f.rose))}" if f.rose else "", f"fell {', '.join(map(named, f.fell))}"
             if f.fell else ""]
    moved = "; ".join(p for p in parts if p)
    return (f"SAE features at {f.hook} on the edited prompts: {moved or 'none moved'} (activations changed "
            f"{100 * f.edited_change:.1f}% of their size); unrelated prompts keep {100 * f.unrelated_kept:.0f}% of "
            f"their top-{TOP_K} features (activations changed {100 * f.unrelated_change:.1f}%)")


def _slots(stmt: ast.DeleteStmt | ast.UpdateStmt, session: Session, run: PlanRun) -> list[tuple[int, int]]:
    """The (layer, feature) slots the WHERE clause selects, from the overlay's view of down_meta."""
    v = _v(session)
    run.take("scan_edges")
    filt = run.take_if("filter")
    if filt is None or not filt["where"]:
        raise _fail(session, stmt, "a WHERE clause is required (it would touch every feature)",
                    'e.g. WHERE layer = 12 AND feature = 40, or WHERE entity = "Paris"')
    where: tuple[ast.Condition, ...] = filt["where"]
    layer = next((c.value for c in where if c.field == "layer" and c.op == "=" and isinstance(c.value, int)), None)
    feature = next((c.value for c in where if c.field == "feature" and c.op == "=" and isinstance(c.value, int)), None)
    if layer is not None and feature is not None and len(where) == 2:
        try:
            v.feature_meta(layer, feature)  # range checks
        except VindexError as e:
            raise _fail(session, stmt, str(e)) from e
        return [(layer, feature)]
    hits = browse.iter_features(v, None if layer is None else [layer])
    rows = [{"layer": h.layer, "feature": h.feature, "token": h.top_token, "score": h.score,
             "relation": v.feature_label(h.layer, h.feature) or ""} for h in hits]
    return [(r["layer"], r["feature"]) for r in filter_rows(rows, where, EDGE_FIELDS, stmt, session)]


def delete(stmt: ast.DeleteStmt, session: Session, result: Result, run: PlanRun) -> None:
    v = _v(session)
    slots = _slots(stmt, session, run)
    run.take("record")
    for layer, feature in slots:
        v.patches.record(PatchOp("delete", layer, feature, reason=f"DELETE {len(slots)} slot(s)"))
    result.title = f"Deleted {len(slots)} feature(s) (patch overlay)" if slots else "(no matching features found)"
    result.columns = ["layer", "feature"]
    result.rows = [[layer, feature] for layer, feature in slots[:50]]
    if len(slots) > 50:
        result.notes.append(f"{len(slots)} features, 50 shown")
    recording_note(v, result)


def update(stmt: ast.UpdateStmt, session: Session, result: Result, run: PlanRun) -> None:
    v = _v(session)
    target: str | None = None
    confidence: float | None = None
    assignments: tuple[ast.Assignment, ...] = run.param("record", "set")
    for a in assignments:
        if a.field in ("target", "top_token", "token") and isinstance(a.value, str):
            target = a.value
        elif a.field in ("confidence", "c_score", "score") and isinstance(a.value, (int, float)):
            confidence = float(a.value)
        else:
            raise _fail(session, stmt, f"cannot SET {a.field} = {a.value!r}",
                        'UPDATE sets the metadata: target = "text" and/or confidence = number')
    slots = _slots(stmt, session, run)
    run.take("record")
    tid = None
    if target is not None:
        tid = first_target_token(v, target)
    for layer, feature in slots:
        ids, scores = v.down_meta(layer)
        new_ids = (tid,) if tid is not None else tuple(int(i) for i in ids[feature])
        new_scores: tuple[float, ...] = (confidence if confidence is not None else float(scores[feature, 0]),)
        if tid is None:
            new_scores += tuple(float(s) for s in scores[feature, 1:])
        v.patches.record(PatchOp("update", layer, feature, meta=MetaOverride(new_ids, new_scores)))
    result.title = f"Updated {len(slots)} feature(s) (patch overlay)" if slots else "(no matching features found)"
    result.columns = ["layer", "feature"]
    result.rows = [[layer, feature] for layer, feature in slots[:50]]
    result.notes.append("metadata only: what DESCRIBE / SELECT say the feature writes; inference is unchanged")
    recording_note(v, result)


def recording_note(v: EditableVindex, result: Result) -> None:
    stack = v.patches
    if stack.recording is not None:
        result.notes.append(f"recording into {stack.recording.name} ({len(stack.pending)} edit(s) pending)")
    else:
        result.notes.append(f"{len(stack.pending)} unsaved edit(s): BEGIN PATCH \"edits.vlp\" then SAVE PATCH keeps them")


def _forced(run: PlanRun) -> bool:
    return run.peek("replace_existing") is not None


def begin_patch(stmt: ast.BeginPatchStmt, session: Session, result: Result, run: PlanRun) -> None:
    stack = _v(session).patches
    path = run.take("begin_patch")["path"]
    stack.begin(path, _forced(run))
    kept = len(stack.pending)
    result.title = f"Patch session started: {path}" + (f" (keeping {kept} earlier edit(s))" if kept else "")


def save_patch(stmt: ast.SavePatchStmt, session: Session, result: Result, run: PlanRun) -> None:
    run.take("save_patch")
    patch = _v(session).patches.save(_forced(run))
    result.title = f"Saved: {patch.path} ({patch.summary()})"


def apply_patch(stmt: ast.ApplyPatchStmt, session: Session, result: Result, run: PlanRun) -> None:
    path = run.take("apply_patch")["path"]
    patch = _v(session).patches.apply(path)
    result.title = f"Applied: {path} ({patch.summary()})"


def remove_patch(stmt: ast.RemovePatchStmt, session: Session, result: Result, run: PlanRun) -> None:
    patch = _v(session).patches.remove(run.take("remove_patch")["path"])
    result.title = f"Removed: {patch.name} ({patch.summary()})"


def show_patches(stmt: ast.ShowPatchesStmt, session: Session, result: Result, run: PlanRun) -> None:
    run.take("show_patches")
    v = _v(session)
    stack = v.patches
    result.title = "Applied patches"
    result.columns = ["#", "name", "operations", "inserts", "updates", "deletes", "weight edits", "facts", "created"]
    for i, p in enumerate(stack.applied, 1):
        c = p.counts()
        facts = p.facts()
        shown = "; ".join(facts[:3]) + (f"; +{len(facts) - 3} more" if len(facts) > 3 else "")
        result.rows.append([i, p.name, len(p.ops), c["insert"], c["update"], c["delete"], c["weight_edit"], shown,
                            p.created_at])
    result.notes.append(f"{len(v.overlay)} feature(s) edited in the overlay; {len(stack.pending)} unsaved edit(s)")
    if stack.recording is not None:
        result.notes.append(f"recording: {stack.recording}")


def compile_stmt(stmt: ast.CompileStmt, session: Session, result: Result, run: PlanRun) -> None:
    from larql.edit.bake.compile import compile_gguf, compile_safetensors, compile_vindex
    from larql.edit.state.view import edit_vindex

    bake = run.take("bake_overlay")
    fmt, into = bake["format"], bake["into"]
    model = run.take_if("write_model")
    policy = run.take("write_atomic")["on_conflict"]
    force = _forced(run)
    v = _v(session) if bake["source"] is None else edit_vindex(bake["source"])
    if fmt == "vindex":
        report = compile_vindex(v, into, policy, overwrite=force)
    elif fmt == "gguf":
        report = compile_gguf(v, into, policy, overwrite=force)
    else:
        assert model is not None  # the planner writes a write_model step for every model format
        report = compile_safetensors(v, into, policy, overwrite=force, dtype=model["dtype"])
    result.title = f"Compiled {v.path} -> {report.path}"
    result.columns = ["measure", "value"]
    result.rows = [["edited features baked", report.edited_features],
                   ["layers with rewritten FFN weights", ", ".join(map(str, report.layers_rewritten)) or "none"],
                   ["FFN width of every layer (wider: features NEURON added)", report.ffn_width],
                   ["features written by several patches", len(report.conflicts)],
                   ["size (MB)", report.size_bytes / 1e6]]
    runs = {"vindex": f'USE "{report.path}"', "gguf": f'larql run {report.path} "..." (or llama.cpp)',
            "safetensors": f'larql run {report.path} "..." (or transformers\' from_pretrained)'}[fmt]
    result.notes.append(f"{runs} runs the edited model with no patch applied")
