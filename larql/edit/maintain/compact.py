"""COMPACT: fold a vindex's patch stack into fewer operations that leave the overlay, and so every
answer, exactly as it was.

The stack replays its applied patches, then the unsaved edits; a later operation on a slot
replaces an earlier one, and weight edits at a layer are concatenated. Folding keeps one operation
per edited slot, setting the slot to its final state (a delete, or an insert of its final vectors
and metadata, which replaces whatever lay under it; the entity / relation / target of the last
insert there is kept, so REBALANCE and MERGE still see the fact), and one weight edit per layer
(the concatenation of its edits, the same arrays the FFN applies).

- MINOR folds the unsaved edits (the applied patches stay as they are);
- MAJOR folds the applied patches and the unsaved edits into one set of unsaved edits, which
  BEGIN PATCH "p.vlp"; SAVE PATCH writes as a single patch file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from larql.edit.patches.overlay import PatchOverlay
from larql.edit.patches.patch import Patch, PatchOp, PatchStack
from larql.edit.patches.weight_op import WeightOp

Op = PatchOp | WeightOp


@dataclass(frozen=True)
class StackSize:
    patches: int  # applied patches, plus one for the unsaved edits when there are any
    ops: int  # operations replayed
    bytes: int  # the vectors and metadata they carry


@dataclass(frozen=True)
class CompactReport:
    level: str  # minor | major
    before: StackSize
    after: StackSize
    slots: int  # feature slots the folded operations set
    weight_layers: int  # layers whose weight edits were joined


def op_bytes(op: Op) -> int:
    if isinstance(op, WeightOp):
        return 4 * (op.u.size + op.v.size + op.keys.size)
    size = sum(4 * vec.size for vec in op.vectors.values())
    return size + (8 * len(op.meta.token_ids) if op.meta is not None else 0)


def stack_size(applied: list[Patch], pending: list[Op]) -> StackSize:
    ops = [o for p in applied for o in p.ops] + pending
    return StackSize(len(applied) + (1 if pending else 0), len(ops), sum(op_bytes(o) for o in ops))


def fold(ops: list[Op], under: list[Op], shape: PatchOverlay) -> list[Op]:
    """Operations that, replayed after `under`, leave the overlay exactly as `under` then `ops` do."""
    base = PatchOverlay(shape.num_layers, shape.num_features, shape.hidden, shape.widths)
    for op in under:
        op.apply(base)
    top = PatchOverlay(shape.num_layers, shape.num_features, shape.hidden, shape.widths)
    for op in under + ops:
        op.apply(top)
    last: dict[tuple[int, int], PatchOp] = {}
    for op in ops:
        if isinstance(op, PatchOp):
            if op.op == "insert" and op.entity is not None:
                last[(op.layer, op.feature)] = op
            elif op.op == "delete":
                last.pop((op.layer, op.feature), None)
    slots = sorted({(op.layer, op.feature) for op in ops if isinstance(op, PatchOp)})
    out: list[Op] = []
    for layer, feature in slots:
        vectors, meta = top.layer(layer).get(feature) or top.added(layer).get(feature), top.meta(layer).get(feature)
        if feature >= shape.widths[layer] and vectors is None:  # an added feature deleted again
            if feature in base.added(layer):
                out.append(PatchOp("delete", layer, feature, reason="COMPACT"))
            continue
        if feature in top.deleted(layer):
            out.append(PatchOp("delete", layer, feature, reason="COMPACT"))
            continue
        fact = last.get((layer, feature))
        parts = {k: getattr(vectors, k) for k in ("gate", "up", "down")} if vectors is not None else {}
        out.append(PatchOp("insert", layer, feature, {k: a for k, a in parts.items() if a is not None}, meta,
                           fact.entity if fact else None, fact.relation if fact else None,
                           fact.target if fact else None, "COMPACT"))
    weights = [op for op in ops if isinstance(op, WeightOp)]
    for layer in sorted({op.layer for op in weights}):
        at = [op for op in weights if op.layer == layer]
        if len(at) == 1:
            out.append(at[0])
            continue
        u, v, keys = (np.concatenate([getattr(op, k) for op in at], axis=1) for k in ("u", "v", "keys"))
        methods = sorted({op.method for op in at})
        out.append(WeightOp(layer, u, v, keys, tuple(f for op in at for f in op.facts), "+".join(methods)))
    return out


def plan_compact(stack: PatchStack, level: str) -> tuple[list[Patch], list[Op]]:
    """(applied, pending) after COMPACT `level`, computed without changing the stack."""
    if level == "minor":
        under = [o for p in stack.applied for o in p.ops]
        return list(stack.applied), fold(stack.pending, under, stack.overlay)
    everything = [o for p in stack.applied for o in p.ops] + stack.pending
    return [], fold(everything, [], stack.overlay)


def compact(stack: PatchStack, level: str) -> CompactReport:
    """Fold the stack (see the module docstring); the overlay is replayed and is as it was."""
    before = stack_size(stack.applied, stack.pending)
    applied, pending = plan_compact(stack, level)
    old = (stack.applied, stack.pending)
    stack.applied, stack.pending = applied, pending
    try:
        stack.replay()
    except Exception:
        stack.applied, stack.pending = old
        stack.replay()
        raise
    slots = sum(1 for o in pending if isinstance(o, PatchOp))
    return CompactReport(level, before, stack_size(applied, pending), slots,
                         len({o.layer for o in pending if isinstance(o, WeightOp)}))
