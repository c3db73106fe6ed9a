"""MERGE, REBALANCE, COMPACT and SHOW COMPACT STATUS: statements that work on the patch stack of the
vindex in use as a whole (edit/maintain/merge.py, edit/maintain/rebalance.py, edit/maintain/compact.py)."""

from __future__ import annotations

from larql.edit.state.view import EditableVindex
from larql.lql import ast
from larql.lql.ops.editing import recording_note
from larql.lql.plan import PlanRun
from larql.lql.result import Result
from larql.lql.session import Session


def _v(session: Session) -> EditableVindex:
    assert session.vindex is not None  # the planner checked
    return session.vindex


def merge_stmt(stmt: ast.MergeStmt, session: Session, result: Result, run: PlanRun) -> None:
    from larql.edit.maintain.merge import merge

    v = _v(session)
    source = run.take("load_source")["source"]
    r = merge(v, source, run.param("resolve", "policy"))  # runs the steps below in one pass (a failure: loading)
    for op in ("move_facts", "replay_incoming", "find_conflicts", "resolve", "record"):
        run.take(op)
    result.title = (f"Merged {r.kind} {source} -> {v.path} (patch overlay): {r.recorded} operation(s) recorded, "
                    f"{len(r.conflicts)} conflict(s) (ON CONFLICT {r.policy.upper()})")
    result.columns = ["layer", "feature", "conflict", "current", "incoming", "winner"]
    result.rows = [[c.layer, c.feature if c.feature >= 0 else "weight edit", c.kind, c.current, c.incoming, c.winner]
                   for c in r.conflicts]
    result.rows += [[layer, f"{old} -> {new}", "moved", current, incoming, "both"]
                    for layer, old, new, current, incoming in r.moved]
    if r.moved:
        layers = sorted({m[0] for m in r.moved})
        result.notes.append(f"{len(r.moved)} incoming fact(s) moved to a free feature (another fact held the slot); "
                            f"REBALANCE AT LAYER {layers[0]} tunes the facts there against each other")
    result.notes.append(f"{r.incoming} incoming operation(s): {r.recorded} recorded, {r.skipped} skipped (lost a "
                        f"conflict), {r.present} already present")
    result.notes += r.notes
    recording_note(v, result)


def rebalance_stmt(stmt: ast.RebalanceStmt, session: Session, result: Result, run: PlanRun) -> None:
    from larql.edit.maintain.rebalance import rebalance

    v = _v(session)
    layer = run.take("find_installs")["layer"]
    run.take("probe")
    run.take("retune_gates")
    loop = run.take("scale_down")  # rebalance() runs probe, retune and the loop as one call
    r = rebalance(v, layer, loop["max_iters"], loop["floor"], loop["ceiling"])
    run.take("record")
    where = f"layer {layer}" if layer is not None else \
        ("layers " + ", ".join(map(str, r.layers)) if r.layers else "no layer")
    result.title = f"Rebalanced {len(r.facts)} fact(s) at {where} (patch overlay, {r.ops} update(s))"
    result.columns = ["fact", "layer", "feature", "p(target) before", "after", "down x"]
    result.rows = [[f.label, f.layer, f.feature, f.p_before, f.p_after, f.down_factor]
                   for f in r.facts]
    if not r.facts:
        result.notes.append("no feature inserts to rebalance (INSERT ... METHOD FEATURE installs them; weight edits "
                            "have none)")
    else:
        result.notes.append(f"{r.iterations} iteration(s); " + ("every fact in the band" if r.converged else
                            "not converged: some fact is outside the band (MAX n, or UNTIL CONVERGED, loops longer)"))
    recording_note(v, result)


def compact_stmt(stmt: ast.CompactStmt, session: Session, result: Result, run: PlanRun) -> None:
    from larql.edit.maintain.compact import compact

    v = _v(session)
    level = run.take("fold")["level"]
    r = compact(v.patches, level)  # folds, then replays the overlay from the folded stack
    run.take("replay")
    result.title = f"Compacted ({level}): {r.before.ops} -> {r.after.ops} operation(s)"
    result.columns = ["measure", "before", "after"]
    result.rows = [["patches (the unsaved edits count as one)", r.before.patches, r.after.patches],
                   ["operations", r.before.ops, r.after.ops],
                   ["bytes carried", r.before.bytes, r.after.bytes]]
    result.notes.append(f"{r.slots} slot(s) set by one operation each, {r.weight_layers} layer(s) with one joined "
                        "weight edit; the overlay, and every answer, is unchanged")
    if level == "major":
        result.notes.append('the folded stack is unsaved: BEGIN PATCH "all.vlp"; SAVE PATCH writes it as one file')


def show_compact_status(stmt: ast.ShowCompactStatusStmt, session: Session, result: Result, run: PlanRun) -> None:
    from larql.edit.maintain.compact import plan_compact, stack_size

    stack = _v(session).patches
    run.take("measure_stack")
    now = stack_size(stack.applied, stack.pending)
    result.title = "Compact status"
    result.columns = ["stack", "patches", "operations", "bytes"]
    result.rows = [["now", now.patches, now.ops, now.bytes]]
    for level in run.take("plan_compact")["levels"]:
        s = stack_size(*plan_compact(stack, level))
        result.rows.append([f"after COMPACT {level.upper()}", s.patches, s.ops, s.bytes])
    result.notes.append(f"{len(stack.applied)} applied patch(es), {len(stack.pending)} unsaved edit(s); "
                        "MINOR folds the unsaved edits, MAJOR everything into one")
