"""The steps of MERGE, REBALANCE, COMPACT and SHOW COMPACT STATUS, with the parameters
ops/maintenance.py reads: what edit/maintain/merge.py, rebalance.py and compact.py run, with their defaults."""

from __future__ import annotations

from pathlib import Path

from larql.edit.methods.defaults import (
    REBALANCE_CEILING,
    REBALANCE_CONVERGED_MAX,
    REBALANCE_FLOOR,
    REBALANCE_GROW,
    REBALANCE_MAX,
    REBALANCE_SHRINK,
)
from larql.lql import ast
from larql.lql.plan import Step


def maintenance_steps(stmt: ast.Statement) -> list[Step]:
    """MERGE, REBALANCE, COMPACT and SHOW COMPACT STATUS: the steps edit/maintain/merge.py, rebalance.py and
    compact.py take, with the defaults they use."""
    if isinstance(stmt, ast.MergeStmt):
        policy = (stmt.on_conflict or "last_wins").upper()
        resolve = ("refuse on any conflict, nothing recorded" if policy == "FAIL" else
                   {"LAST_WINS": "the incoming edit wins (a fact's old feature is deleted)",
                    "KEEP_CURRENT": "the session's edit stays, the incoming one is skipped",
                    "HIGHEST_CONFIDENCE": "the higher c_score wins, a tie keeps the current one"}[policy])
        vindex = (Path(stmt.source) / "index.json").is_file() or stmt.source.rstrip("/").endswith(".vindex")
        load = ("a vindex: its edits are the DIFF of the base in use vs it" if vindex
                else "a patch file: its operations, checked against the vindex in use")
        return [Step("load_source", f"{stmt.source}: {load}", {"source": stmt.source}),
                Step("move_facts", "an incoming fact in a slot holding another fact -> the next least-used feature"),
                Step("replay_incoming", "on an empty overlay: one state per slot it touches"),
                Step("find_conflicts", "slots both sides edit differently; (entity, relation) with another target"),
                Step("resolve", f"on conflict {policy}: {resolve}", {"policy": policy.lower()}),
                Step("record", "patch overlay, unsaved edits (all or nothing; edits already present skipped)")]
    if isinstance(stmt, ast.RebalanceStmt):
        limit = stmt.max_iters if stmt.max_iters is not None else (
            REBALANCE_CONVERGED_MAX if stmt.until_converged else REBALANCE_MAX)
        floor = REBALANCE_FLOOR if stmt.floor is None else stmt.floor
        ceiling = REBALANCE_CEILING if stmt.ceiling is None else stmt.ceiling
        where = f"layer {stmt.layer}" if stmt.layer is not None else "every layer holding some"
        return [Step("find_installs", f"feature inserts (INSERT ... METHOD FEATURE) at {where}", {"layer": stmt.layer}),
                Step("probe", "p(target | its prompt) per fact, before"),
                Step("retune_gates", "each fact's gate/up orthogonal to the decoys and the other facts' prompts"),
                Step("scale_down", f"x{REBALANCE_GROW} below FLOOR {_fmt(floor)}, x{REBALANCE_SHRINK} above CEILING {_fmt(ceiling)}, "
                                   f"at most {limit} iteration(s)", {"floor": floor, "ceiling": ceiling, "max_iters": limit}),
                Step("record", "patch overlay, one update per fact (gate, up, down, c_score)")]
    if isinstance(stmt, ast.CompactStmt):
        what = "the unsaved edits" if stmt.level == "minor" else "the applied patches and the unsaved edits"
        return [Step("fold", f"{what}: one operation per edited slot, one weight edit per layer", {"level": stmt.level}),
                Step("replay", "the overlay from the folded stack (every answer unchanged)")]
    return [Step("measure_stack", "applied patches and unsaved edits: operations, bytes"),
            Step("plan_compact", "what COMPACT MINOR and COMPACT MAJOR would leave (nothing changes)",
                 {"levels": ("minor", "major")})]


def _fmt(x: float) -> str:
    return f"{x:g}"
