"""MERGE: the edits of a patch file, or of another vindex of the same model, added to the edits of
the vindex in use (recorded on its patch stack as unsaved edits, all or nothing), with a policy for
what both sides edit.

The incoming edits: a `.vlp` file's operations as they are; a vindex's, what DIFF finds between the
base of the vindex in use (no overlay) and that vindex as it runs (a compiled vindex: the features
its edits changed). The incoming feature edits are replayed on an empty overlay of the same shape, so
each slot they touch has one incoming state (vectors, metadata, deletion) to compare with the
session's.

Conflicts:
- slot: both sides edit one (layer, feature) and leave it in different states;
- fact: the incoming side inserts (entity, relation) -> target and the session already holds that
  entity and relation with another target, at another slot or in a weight edit.
An incoming slot in exactly the session's state, or a weight edit the stack already holds, is
skipped as already present (merging a patch twice changes nothing). Two *different* facts inserted
in one slot (two sessions each took the layer's least-used feature) are no conflict: the incoming
fact moves to the next least-used feature that neither side edits.

Policies (ON CONFLICT):
- LAST_WINS (the default; LARQL's KEEP_SOURCE): the incoming edit wins; for a fact conflict the
  session's feature for the old target is deleted;
- KEEP_CURRENT (LARQL's KEEP_TARGET): the session's edit stays, the incoming one is skipped;
- HIGHEST_CONFIDENCE: the side whose feature claims the higher c_score (down_meta's first score;
  an inserted feature's is its p(target) when installed) wins, a tie keeps the current one; a
  weight edit claims none (the current side wins against it);
- FAIL: any conflict refuses the MERGE, naming the conflicts; nothing changes.
Weight edits (ROME / MEMIT) have no slot and add up: one in a fact conflict is kept only when the
incoming side wins, and then both weight edits stay (the note says so).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from larql.edit.patches.overlay import FeatureOverride, MetaOverride, PatchOverlay
from larql.edit.patches.patch import Patch, PatchOp, Shape, load_patch, made_for
from larql.edit.patches.weight_op import WeightOp
from larql.edit.state.view import EditableVindex
from larql.errors import EditError

POLICIES = ("last_wins", "keep_current", "highest_confidence", "fail")
ALIASES = {"keep_source": "last_wins", "keep_target": "keep_current"}  # LARQL's names

SlotState = tuple[FeatureOverride | None, MetaOverride | None, bool]


@dataclass(frozen=True)
class Conflict:
    kind: str  # slot | fact
    layer: int
    feature: int  # -1 for a weight edit
    current: str  # what the session holds
    incoming: str  # what the source brings
    winner: str  # current | incoming

    def text(self) -> str:
        where = f"L{self.layer} F{self.feature}" if self.feature >= 0 else f"L{self.layer} weight edit"
        return f"{where}: current {self.current}, incoming {self.incoming}"


@dataclass
class MergeReport:
    source: str
    kind: str  # patch | vindex
    policy: str
    incoming: int = 0  # operations the source brings
    recorded: int = 0  # operations recorded on the session's stack
    skipped: int = 0  # operations dropped (losers of a conflict)
    present: int = 0  # operations already in the session
    conflicts: list[Conflict] = field(default_factory=list)
    moved: list[tuple[int, int, int, str, str]] = field(default_factory=list)  # layer, from, to, current, incoming
    notes: list[str] = field(default_factory=list)


def _state(overlay: PatchOverlay, layer: int, feature: int) -> SlotState:
    vectors = overlay.layer(layer).get(feature) or overlay.added(layer).get(feature)
    return vectors, overlay.meta(layer).get(feature), feature in overlay.deleted(layer)


def _edited(s: SlotState) -> bool:
    return s[0] is not None or s[1] is not None or s[2]


def _same(a: SlotState, b: SlotState) -> bool:
    if a[2] != b[2] or a[1] != b[1] or (a[0] is None) != (b[0] is None):
        return False
    if a[0] is None or b[0] is None:
        return True
    return all((x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y))
               for x, y in zip(a[0], b[0]))


def _score(v: EditableVindex, layer: int, feature: int, meta: MetaOverride | None, deleted: bool) -> float:
    if deleted:
        return float("-inf")
    if meta is not None:
        return float(meta.scores[0])
    return float(v.down_meta(layer)[1][feature, 0]) if feature < v.num_features(layer) else 0.0


def _facts(ops: list[PatchOp | WeightOp]) -> dict[tuple[int, int], PatchOp]:
    """(layer, feature) -> the last insert op with a fact, in order."""
    out: dict[tuple[int, int], PatchOp] = {}
    for op in ops:
        if isinstance(op, PatchOp) and op.op == "insert" and op.entity is not None:
            out[(op.layer, op.feature)] = op
        elif isinstance(op, PatchOp) and op.op == "delete":
            out.pop((op.layer, op.feature), None)
    return out


def _key(entity: str | None, relation: str | None) -> tuple[str, str]:
    return ((entity or "").strip().lower(), (relation or "").strip().lower().replace("_", "-"))


def _label(op: PatchOp | None, v: EditableVindex, s: SlotState) -> str:
    if s[2]:
        return "deleted"
    if op is not None and op.entity is not None:
        text = f"{op.entity} -[{op.relation or '?'}]-> {op.target}"
    elif s[1] is not None:
        text = f"writes {v.token_text(s[1].token_ids[0])!r}"
    else:
        text = "new vectors"
    return text + (f" (c {s[1].scores[0]:.3g})" if s[1] is not None else "")


def load_source(v: EditableVindex, source: str | Path) -> tuple[str, list[PatchOp | WeightOp]]:
    """('patch' | 'vindex', the incoming operations) for a .vlp file or a vindex directory."""
    path = Path(source)
    if (path / "index.json").is_file():
        from larql.edit.maintain.diff import diff
        from larql.edit.state.view import edit_vindex

        other = edit_vindex(path)
        report = diff(EditableVindex(v.store), other)
        if report.dense:
            raise EditError(f"MERGE {path}: it differs from the vindex in use outside the FFN ({report.dense[0]}"
                            f"{' and more' if len(report.dense) > 1 else ''}), which an overlay cannot carry; "
                            f"merge a patch of it, or use a vindex of the same base")
        return "vindex", list(report.ops)
    if path.is_dir():
        raise EditError(f"MERGE {path}: a directory without index.json, neither a vindex nor a patch file; "
                        f"name a .vindex directory or a .vlp file")
    if not path.exists():
        raise EditError(f"MERGE {path}: no such file or vindex; name a .vindex directory or a .vlp file")
    s = v.store
    patch: Patch = load_patch(path, Shape(s.hidden, v.overlay.num_features, s.num_layers, s.vocab_size))
    if not made_for(patch, s.index):
        raise EditError(f"MERGE {path}: this patch was made for {patch.base_model!r}, the vindex in use holds "
                        f"{s.index['model']!r}; merge patches of the same model")
    return "patch", list(patch.ops)


def merge(v: EditableVindex, source: str | Path, policy: str = "last_wins") -> MergeReport:
    """Merge the source's edits into `v`'s overlay under `policy`; FAIL on a conflict raises and
    records nothing."""
    policy = ALIASES.get(policy, policy)
    if policy not in POLICIES:
        raise EditError(f"unknown ON CONFLICT policy {policy!r}; one of {', '.join(p.upper() for p in POLICIES)}")
    kind, ops = load_source(v, source)
    report = MergeReport(str(source), kind, policy, incoming=len(ops))
    stack = v.patches
    current_ops = [o for p in stack.applied for o in p.ops] + stack.pending
    ov = v.overlay
    cur_facts = {k: f for k, f in _facts(current_ops).items() if _edited(_state(ov, *k))}
    ops, report.moved = _relocate(v, ops, cur_facts)
    scratch = PatchOverlay(ov.num_layers, ov.num_features, ov.hidden, ov.widths)
    for op in ops:
        if isinstance(op, PatchOp):
            op.apply(scratch)
    in_facts = _facts(ops)
    by_fact = {_key(op.entity, op.relation): (slot, op) for slot, op in cur_facts.items()}
    weight_facts = {_key(f.get("subject"), f.get("relation")): (op.layer, f.get("target", ""))
                    for op in current_ops if isinstance(op, WeightOp) for f in op.facts}

    drop: set[tuple[int, int]] = set()  # incoming slots not recorded
    extra: list[PatchOp] = []  # deletes of the session's features that lost a fact conflict
    for slot in sorted({(op.layer, op.feature) for op in ops if isinstance(op, PatchOp)}):
        cur, inc = _state(ov, *slot), _state(scratch, *slot)
        if _same(cur, inc):
            drop.add(slot)
            report.present += sum(1 for o in ops if isinstance(o, PatchOp) and (o.layer, o.feature) == slot)
            continue
        in_op, inc_score = in_facts.get(slot), _score(v, *slot, inc[1], inc[2])
        key = _key(in_op.entity, in_op.relation) if in_op is not None else None
        hit = by_fact.get(key) if key is not None else None
        w = weight_facts.get(key) if key is not None else None
        if _edited(cur):
            win = _winner(policy, _score(v, *slot, cur[1], cur[2]), inc_score)
            c = Conflict("slot", *slot, _label(cur_facts.get(slot), v, cur), _label(in_op, v, inc), win)
        elif hit is not None and _differs(hit[1].target, in_op.target):  # type: ignore[union-attr]
            (hl, hf), hop = hit
            hs = _state(ov, hl, hf)
            win = _winner(policy, _score(v, hl, hf, hs[1], hs[2]), inc_score)
            c = Conflict("fact", hl, hf, _label(hop, v, hs), f"{_label(in_op, v, inc)} at L{slot[0]} F{slot[1]}", win)
            if win == "incoming":
                extra.append(PatchOp("delete", hl, hf, reason=f"MERGE: replaced by {source}"))
        elif w is not None and _differs(w[1], in_op.target):  # type: ignore[union-attr]
            win = _winner(policy, float("-inf"), inc_score)  # a weight edit claims no c_score
            c = Conflict("fact", w[0], -1, f"{in_op.entity} -[{in_op.relation}]-> {w[1]} (weight edit)",  # type: ignore[union-attr]
                         f"{_label(in_op, v, inc)} at L{slot[0]} F{slot[1]}", win)
            if win == "incoming":
                report.notes.append(f"L{w[0]}: the weight edit teaching {w[1]!r} stays (weight edits have no slot); "
                                    "REMOVE PATCH it if it still competes")
        else:
            continue
        report.conflicts.append(c)
        if win == "current":
            drop.add(slot)
    held = [o for o in current_ops if isinstance(o, WeightOp)]
    keep: list[PatchOp | WeightOp] = []
    for op in ops:
        if isinstance(op, WeightOp):
            if any(_same_weight(op, h) for h in held):
                report.present += 1
                continue
            clash_w = [f for f in op.facts if _differs(_current_target(f, weight_facts, by_fact), f.get("target"))]
            if clash_w:
                f = clash_w[0]
                win = _winner(policy, float("-inf"), float("-inf"))  # a weight edit claims no c_score: a tie
                report.conflicts.append(Conflict("fact", op.layer, -1, f"{f.get('subject')} -[{f.get('relation')}]-> "
                                                 f"{_current_target(f, weight_facts, by_fact)}", f"{f.get('subject')} -[{f.get('relation')}]-> "
                                                 f"{f.get('target')} (weight edit)", win))
                if win == "current":
                    report.skipped += 1
                    continue
            keep.append(op)
        elif (op.layer, op.feature) in drop:
            if not _same(_state(ov, op.layer, op.feature), _state(scratch, op.layer, op.feature)):
                report.skipped += 1
        else:
            keep.append(op)
    if policy == "fail" and report.conflicts:
        shown = "; ".join(c.text() for c in report.conflicts[:3])
        more = f" and {len(report.conflicts) - 3} more" if len(report.conflicts) > 3 else ""
        raise EditError(f"MERGE {source}: {len(report.conflicts)} conflict(s): {shown}{more}; nothing was merged "
                        f"(ON CONFLICT LAST_WINS, KEEP_CURRENT or HIGHEST_CONFIDENCE resolves them)")
    keep = [*extra, *keep]
    stack.record_all(keep)
    report.recorded = len(keep)
    return report


def _relocate(v: EditableVindex, ops: list[PatchOp | WeightOp], cur_facts: dict[tuple[int, int], PatchOp]
              ) -> tuple[list[PatchOp | WeightOp], list[tuple[int, int, int, str, str]]]:
    """Two different facts installed in one slot (each session picked the layer's least-used
    feature): the incoming fact's operations move to the next least-used feature nobody edits; an
    added feature (both sessions numbered theirs from the layer's width) to the next free number."""
    in_facts = _facts(ops)
    ov = v.overlay
    clash = {slot for slot, op in in_facts.items() if slot in cur_facts
             and _key(op.entity, op.relation) != _key(cur_facts[slot].entity, cur_facts[slot].relation)}
    # an added feature without a fact (a DIFF of a vindex compiled with neurons) on one the session added
    # too is another feature, not the same slot edited twice: it moves like a clashing fact
    clash |= {(op.layer, op.feature) for op in ops if isinstance(op, PatchOp) and op.op == "insert"
              and op.feature >= ov.widths[op.layer] and (op.layer, op.feature) not in in_facts
              and _other_added(ov.added(op.layer).get(op.feature), op)}
    if not clash:
        return ops, []
    taken = {(op.layer, op.feature) for op in ops if isinstance(op, PatchOp)}
    where: dict[tuple[int, int], int] = {}
    for layer, feature in sorted(clash):
        if feature >= ov.widths[layer]:  # both added a feature (METHOD NEURON): the incoming one goes after all
            mine = [f for l, f in taken if l == layer] + [new for (l, _), new in where.items() if l == layer]
            where[(layer, feature)] = max([ov.next_feature(layer) - 1, *mine]) + 1
            continue
        busy = set(ov.layer(layer)) | set(ov.meta(layer)) | ov.deleted(layer) | \
            {f for l, f in taken if l == layer} | {new for (l, _), new in where.items() if l == layer}
        free = next((f for f in _least_used(v, layer) if f not in busy), None)
        if free is None:
            raise EditError(f"MERGE: layer {layer} has no free feature left for "
                            f"{in_facts[(layer, feature)].entity}; DELETE some inserted facts first")
        where[(layer, feature)] = free
    moved = [(l, f, where[(l, f)], _label(cur_facts.get((l, f)), v, _state(ov, l, f)),
              f"{op.entity} -[{op.relation}]-> {op.target}" if (op := in_facts.get((l, f))) is not None
              else _label(None, v, _incoming(ops, l, f))) for l, f in sorted(clash)]
    out = [dataclasses.replace(op, feature=where[(op.layer, op.feature)])
           if isinstance(op, PatchOp) and (op.layer, op.feature) in where else op for op in ops]
    return out, moved


def _other_added(current: FeatureOverride | None, op: PatchOp) -> bool:
    """Whether the session's added feature `current` is there and is not what `op` inserts."""
    return current is not None and any(op.vectors.get(k) is None or not np.array_equal(op.vectors[k], getattr(current, k))
                                       for k in ("gate", "up", "down"))


def _incoming(ops: list[PatchOp | WeightOp], layer: int, feature: int) -> SlotState:
    """What the last incoming insert at the slot says of it (for its label)."""
    op = [o for o in ops if isinstance(o, PatchOp) and o.op == "insert" and (o.layer, o.feature) == (layer, feature)][-1]
    return None, op.meta, False


def _least_used(v: EditableVindex, layer: int) -> list[int]:
    """The layer's features, least used first: INSERT's measure (mean |activation| on the decoy
    prompts x |down column|) with model weights and a dense FFN, else the lowest down_meta score."""
    if not v.has_model_weights or v.num_experts(layer):
        return [int(f) for f in np.argsort(np.abs(v.store.down_meta(layer)[1][:, 0]), kind="stable")]
    from larql.edit.methods.feature import DECOY_PROMPTS, ffn_inputs

    model = v.model()
    _, acts = ffn_inputs(model, list(DECOY_PROMPTS), layer, last_only=True)
    down_matrix = model.weights.layers[layer].down
    assert down_matrix is not None and acts is not None  # a dense FFN (experts are ranked above)
    down = down_matrix.dequantize()
    return [int(f) for f in np.argsort(np.abs(acts).mean(axis=0) * np.linalg.norm(down, axis=0), kind="stable")]


def _winner(policy: str, current: float, incoming: float) -> str:
    if policy == "keep_current":
        return "current"
    if policy == "highest_confidence":
        return "incoming" if incoming > current else "current"
    return "incoming"  # last_wins (and fail, which refuses before anything is recorded)


def _differs(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.strip().lower() != b.strip().lower()


def _current_target(f: dict[str, str], weights: dict[tuple[str, str], tuple[int, str]],
                    features: dict[tuple[str, str], tuple[tuple[int, int], PatchOp]]) -> str | None:
    key = _key(f.get("subject"), f.get("relation"))
    if key in features:
        return features[key][1].target
    return weights[key][1] if key in weights else None


def _same_weight(a: WeightOp, b: WeightOp) -> bool:
    return a.layer == b.layer and a.u.shape == b.u.shape and np.array_equal(a.u, b.u) and np.array_equal(a.v, b.v)
