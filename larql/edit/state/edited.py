"""What an edit needs of the editable state, and what it asks of the edits already made: the
`EditTarget` protocol (the editable view satisfies it; the methods and INSERT take it, so they never
import the view) and the feature inserts a patch stack holds in place."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.typing import NDArray

from larql.edit.patches.overlay import PatchOverlay
from larql.edit.patches.patch import PatchOp, PatchStack, is_neuron
from larql.vindex.reader import VindexReader
from larql.vindex.store import Vindex

if TYPE_CHECKING:
    from larql.model.model import Model


class EditTarget(VindexReader, Protocol):
    """A vindex that can be edited: the read-only store, the overlay its edits fill and the patch
    stack that records them, the model that runs over them, and its float32 weights."""

    store: Vindex
    overlay: PatchOverlay
    patches: PatchStack

    @property
    def has_model_weights(self) -> bool: ...

    def model(self) -> Model: ...

    def float32_weights(self) -> list[NDArray[np.float32]]: ...


def installed(vindex: EditTarget, layer: int, neurons: bool = False) -> list[PatchOp]:
    """The feature inserts live at `layer` (METHOD NEURON's with `neurons`): the last insert op per
    slot over the applied patches and the unsaved edits, for slots the overlay still holds."""
    stack = vindex.patches
    live: dict[int, PatchOp] = {}
    for op in [o for p in stack.applied for o in p.ops] + stack.pending:
        if op.layer != layer:
            continue
        if isinstance(op, PatchOp) and op.op == "insert" and op.entity is not None:
            live[op.feature] = op
        elif op.op == "delete":
            live.pop(op.feature, None)
    overlay = vindex.overlay
    return [op for f, op in live.items() if (layer, f) in overlay and is_neuron(op) == neurons]


def neuron_subjects(vindex: EditTarget) -> list[str]:
    """The subjects of the METHOD NEURON features in place, at every layer (what a new neuron's key
    must tell its subject from, `defaults.subject_keys`)."""
    return [op.entity for layer in range(vindex.num_layers) for op in installed(vindex, layer, neurons=True)
            if op.entity]
