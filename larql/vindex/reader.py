"""What reading a vindex means, whoever holds it: the protocols a read-only store and an editable view
both satisfy (browsing, DESCRIBE and the editing methods take these, never a concrete class), and
a feature's metadata read through them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from larql.errors import VindexError
from larql.model.tokenizer import TextTokenizer


@dataclass(frozen=True)
class FeatureMeta:
    """What feature `feature` of `layer` writes: its top output tokens by score."""

    layer: int
    feature: int
    token_ids: tuple[int, ...]
    tokens: tuple[str, ...]
    scores: tuple[float, ...]

    @property
    def top_token(self) -> str:
        return self.tokens[0]

    @property
    def c_score(self) -> float:
        return self.scores[0]


class MetaSource(Protocol):
    """What feature_meta reads: a store, or an editable view whose down_meta carries its edits."""

    @property
    def path(self) -> Path: ...

    def num_features(self, layer: int) -> int: ...

    def num_experts(self, layer: int) -> int: ...

    def down_meta(self, layer: int) -> tuple[NDArray[np.uint32], NDArray[np.float32]]: ...

    def token_text(self, token_id: int) -> str: ...


def feature_meta(v: MetaSource, layer: int, feature: int) -> FeatureMeta:
    """What `feature` of `layer` writes, as `v.down_meta` has it."""
    n = v.num_features(layer)
    if not isinstance(feature, (int, np.integer)) or not 0 <= feature < n:
        raise VindexError(f"{v.path}: feature {feature} out of range 0..{n - 1} at layer {layer}")
    ids, scores = v.down_meta(layer)
    token_ids = tuple(int(t) for t in ids[feature])
    return FeatureMeta(int(layer), int(feature), token_ids, tuple(v.token_text(t) for t in token_ids),
                       tuple(float(s) for s in scores[feature]))


def expert_of(v: MetaSource, layer: int, feature: int) -> tuple[int, int] | None:
    """(expert, its feature) of a mixture-of-experts layer's feature `feature` (expert e's
    feature j is stored as e x features-per-expert + j); None for a dense layer."""
    experts = v.num_experts(layer)
    if not experts:
        return None
    return divmod(int(feature), v.num_features(layer) // experts)


def feature_name(v: MetaSource, layer: int, feature: int) -> str:
    """How a feature is named to people: `L3 F17`, or `L1 E2 F17` for expert 2's feature 17."""
    where = expert_of(v, layer, feature)
    return f"L{layer} F{feature}" if where is None else f"L{layer} E{where[0]} F{where[1]}"


class VindexReader(MetaSource, Protocol):
    """What browsing and DESCRIBE read (larql.vindex.browse, .describe): a Vindex, or an
    EditableVindex, which reads through its patch overlay."""

    @property
    def index(self) -> dict[str, Any]: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def tokenizer(self) -> TextTokenizer: ...

    def feature_meta(self, layer: int, feature: int) -> FeatureMeta: ...

    def feature_label(self, layer: int, feature: int) -> str | None: ...

    def feature_ids(self, layer: int) -> Sequence[int]: ...

    def feature_name(self, layer: int, feature: int) -> str: ...

    def gate_knn(self, layer: int, query: NDArray[np.float32], k: int = 10) -> list[tuple[int, float]]: ...

    def token_embedding(self, token_id: int, scaled: bool = True) -> NDArray[np.float32]: ...

    def entity_embedding(self, text: str, scaled: bool = True) -> NDArray[np.float32]: ...
