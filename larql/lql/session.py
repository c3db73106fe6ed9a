"""Session: what a run of LQL statements shares — the vindex in use (an editable view: the
read-only store plus its patch overlay), the SAEs attached by USE SAE, and the source text."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the view (numpy, faiss) loads only when a vindex is opened
    from larql.edit.state.view import EditableVindex
    from larql.model.sae import SAE


@dataclass(frozen=True)
class AttachedSae:
    """An SAE attached by USE SAE: the path as written, its hook point's layer (None: a global one) and
    its features' labels (USE SAE ... LABELS)."""

    sae: SAE
    path: str
    layer: int | None
    labels: Mapping[int, str] = field(default_factory=dict)


@dataclass
class Session:
    vindex: EditableVindex | None = None  # set by USE / EXTRACT
    model: Any = None  # a larql.Model set by USE MODEL
    source: str = ""  # the LQL text being run (for error carets)
    progress: Any = None  # callable(stage, done, total) for long statements, or None
    remote: Any = None  # a lql.remote.Remote set by USE REMOTE: statements run on that server
    next_logits: Any = None  # callable(model, ids) -> logits run for INFER (a server's batcher), or None
    saes: dict[str, AttachedSae] = field(default_factory=dict)  # by hook name: USE SAE, at most one per hook point

    def describe_backend(self) -> str:
        if self.remote is not None:
            return f"remote {self.remote.describe()}"
        v = self.vindex
        if v is None:
            return "no vindex in use"
        i = v.index
        return (f"{v.path} ({i['num_layers']} layers, {sum(e['num_features'] for e in i['layers']):,} features, "
                f"model: {i['model']}, level: {i['extract_level']})")
