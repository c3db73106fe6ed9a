"""The editable view of a vindex: the read-only store, the patch overlay over it, and the patch
stack that fills the overlay. Everything LQL reads or edits goes through one of these.

Reading through the view shows the edits: `down_meta` / `feature_meta` carry overridden, deleted
and added features (rows past the store's width), `gate_knn` rescores edited gates, scores added
ones and skips deleted features, and `model()` runs
the walk FFN over the overlay (an edit shows at the next forward pass). The store itself never
changes; what the view does not edit it reads straight from the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from larql.edit.patches.overlay import PatchOverlay
from larql.edit.patches.patch import PatchStack
from larql.vindex import knn
from larql.vindex.queries import VindexQueries
from larql.vindex.reader import FeatureMeta, feature_meta
from larql.vindex.store import Vindex, open_vindex

F32 = NDArray[np.float32]

if TYPE_CHECKING:  # the runtime (numba) is imported by model() only: USE and --plan do not need it
    from larql.edit.insert import InsertReport
    from larql.edit.methods.facts import Fact
    from larql.model.model import Model
    from larql.model.tokenizer import TextTokenizer
    from larql.quant import QuantMatrix


class EditableVindex(VindexQueries):
    """A vindex with an in-memory patch overlay. Build one with `larql.edit_vindex(path)` or
    `EditableVindex(store)`; `overlay` starts empty, `patches` records and replays into it."""

    def __init__(self, store: Vindex) -> None:
        self.store = store
        # a mixture-of-experts layer numbers every expert's features in one range (FORMAT.md)
        widths = [store.num_features(layer) for layer in range(store.num_layers)]
        self.overlay = PatchOverlay(store.num_layers, max(widths), store.hidden, widths)
        self.patches = PatchStack(store, self.overlay)
        self._model: Model | None = None  # the walk model, built on first use (it repacks weights once)
        self._float32_weights: list[F32] = []  # float32_weights
        # layer -> ((overlay revision, top_k), feature -> down_meta row computed from its down vector)
        self._written_rows: dict[int, tuple[tuple[int, int], dict[int, tuple[NDArray[np.int64], F32]]]] = {}

    # -- read through to the store --------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self.store.path

    @property
    def index(self) -> dict[str, Any]:
        return self.store.index

    @property
    def num_layers(self) -> int:
        return self.store.num_layers

    @property
    def hidden(self) -> int:
        return self.store.hidden

    @property
    def vocab_size(self) -> int:
        return self.store.vocab_size

    @property
    def has_model_weights(self) -> bool:
        return self.store.has_model_weights

    @property
    def tokenizer(self) -> TextTokenizer:
        return self.store.tokenizer

    @property
    def relation_clusters(self) -> dict[str, Any] | None:
        return self.store.relation_clusters

    @property
    def feature_clusters(self) -> dict[tuple[int, int], int]:
        return self.store.feature_clusters

    def num_features(self, layer: int) -> int:
        """One past the layer's last feature, counting the ones METHOD NEURON added (ids from the
        store's width up; a removed one leaves a hole: `feature_ids` lists those that exist)."""
        n = self.store.num_features(layer)
        return self.overlay.next_feature(layer) if self.overlay.added(layer) else n

    def feature_ids(self, layer: int) -> Sequence[int]:
        added = self.overlay.added(layer)
        base = range(self.store.num_features(layer))
        return [*base, *added] if added else base

    def num_experts(self, layer: int) -> int:
        return self.store.num_experts(layer)

    def feature_name(self, layer: int, feature: int) -> str:
        return self.store.feature_name(layer, feature)

    def gate_vectors(self, layer: int) -> NDArray[np.floating]:
        """The stored gate vectors (edited gates live in the overlay; see gate_knn)."""
        return self.store.gate_vectors(layer)

    def token_text(self, token_id: int) -> str:
        return self.store.token_text(token_id)

    def token_embedding(self, token_id: int, scaled: bool = True) -> NDArray[np.float32]:
        return self.store.token_embedding(token_id, scaled)

    def entity_embedding(self, text: str, scaled: bool = True) -> NDArray[np.float32]:
        return self.store.entity_embedding(text, scaled)

    def feature_label(self, layer: int, feature: int) -> str | None:
        return self.store.feature_label(layer, feature)

    # -- reads that see the overlay -------------------------------------------------------------

    def deleted(self, layer: int) -> AbstractSet[int]:
        return self.overlay.deleted(layer)

    def down_meta(self, layer: int) -> tuple[NDArray[np.uint32], NDArray[np.float32]]:
        """The store's down_meta with the overlay applied: edited rows replaced, deleted rows
        empty (zeros, as the format writes an empty feature). Unedited layers are the store's views."""
        ids, scores = self.store.down_meta(layer)
        metas, gone = self.overlay.meta(layer), self.overlay.deleted(layer)
        written = any(ov.down is not None for ov in self.overlay.layer(layer).values())  # a base down replaced
        if not metas and not gone and not written and not self.overlay.added(layer):
            return ids, scores
        more = self.num_features(layer) - len(ids)  # added features' rows (a removed one's stays empty)
        ids = np.concatenate([ids, np.zeros((more, ids.shape[1]), ids.dtype)]) if more else ids.copy()
        scores = np.concatenate([scores, np.zeros((more, scores.shape[1]), scores.dtype)]) if more else scores.copy()
        top_k = ids.shape[1]
        for f in gone:
            ids[f], scores[f] = 0, 0.0
        for f, m in metas.items():
            k = min(len(m.token_ids), top_k)
            ids[f], scores[f] = 0, 0.0
            ids[f, :k], scores[f, :k] = m.token_ids[:k], m.scores[:k]
        for f, (row_ids, row_scores) in self._written(layer, set(metas) | gone, top_k).items():
            ids[f], scores[f] = row_ids, row_scores
        return ids, scores

    def _written(self, layer: int, skip: AbstractSet[int], top_k: int) -> dict[int, tuple[NDArray[np.int64], F32]]:
        """down_meta rows of the features whose down vector the overlay holds and whose metadata it does
        not (an added feature from a patch without down_meta, a down vector REBALANCE scaled): the
        top_k tokens t by U[t] . down, as extraction computes them; kept until the overlay changes."""
        kept = self._written_rows.get(layer)  # `skip` comes from the overlay too: the revision covers it
        if kept is not None and kept[0] == (self.overlay.revision, top_k):
            return kept[1]
        edited = {**self.overlay.layer(layer), **self.overlay.added(layer)}
        todo = sorted(f for f, ov in edited.items() if ov.down is not None and f not in skip)
        rows: dict[int, tuple[NDArray[np.int64], F32]] = {}
        if todo:
            unembed = self._unembedding()
            downs = np.stack([edited[f].down for f in todo]).astype(np.float32)  # type: ignore[misc]  # (n, hidden)
            top = unembed.top_k(downs, top_k)  # (n, k) by score, descending
            exact = np.einsum("nkh,nh->nk", unembed.rows(top.reshape(-1)).reshape(*top.shape, -1), downs)
            rows = {f: (top[i], exact[i].astype(np.float32)) for i, f in enumerate(todo)}
        self._written_rows[layer] = ((self.overlay.revision, top_k), rows)
        return rows

    def _unembedding(self) -> QuantMatrix:
        """What extraction scored down vectors against: the model's unembedding, or with no weights
        the stored embeddings (a browse vindex; its model ties them)."""
        from larql.quant import GGMLType, QuantMatrix  # numba: only when a row must be computed

        if self.has_model_weights:
            return self.model().weights.output
        e = self.store.embeddings
        qtype = GGMLType.F16 if e.dtype == np.float16 else GGMLType.F32
        return QuantMatrix("embeddings", qtype, e.shape[0], e.shape[1], e.view(np.uint8).reshape(e.shape[0], -1))

    def feature_meta(self, layer: int, feature: int) -> FeatureMeta:
        return feature_meta(self, layer, feature)

    def gate_knn(self, layer: int, query: NDArray[np.float32], k: int = 10) -> list[tuple[int, float]]:
        """The store's gate KNN with edited and added gates scored and deleted features left out."""
        edited = {**self.overlay.layer(layer), **self.overlay.added(layer)}
        gates = {f: ov.gate for f, ov in edited.items() if ov.gate is not None}
        return knn.gate_knn(self.store, layer, query, k, gates, self.overlay.deleted(layer))

    def model(self) -> Model:
        """The model the vindex carries (inference level and up), loaded once; its FFN is the walk
        FFN over `overlay`, so edits show at once. `model().dense()` ignores the overlay."""
        if self._model is None:
            from larql.edit.state.walk_ffn import OverlayEdits
            from larql.vindex.runtime import carried_model

            self._model = carried_model(self.store, OverlayEdits(self.overlay))
        return self._model

    def float32_weights(self) -> list[F32]:
        """The model's float32 weights (`model.weights.float32_copies`; none for a model past its
        budget), kept for as long as this view lives: an editing session's INSERTs then dequantize no
        weight in their batched passes, a large part of an INSERT's time (the value step made
        most of them for each INSERT anyway). A caller holds the list
        while it runs (a served session's view keeps nothing: see serve/sessions.py)."""
        if not self._float32_weights:
            from larql.model.weights import float32_copies

            self._float32_weights = float32_copies(self.model().weights)
        return self._float32_weights

    def insert(self, facts: Fact | Sequence[Fact], method: str | None = None, **options: Any) -> InsertReport:
        """Teach the model `facts` through this view's overlay, all or nothing, and report what the
        edit did (each fact's scores before and after, unrelated prompts, the subjects' other
        relations). `method`: "neuron", "rome", "memit" or "feature"; None takes the model's measured
        default. The options are `larql.edit.insert.insert_facts`'s (layers, measure, progress, ...).

        Example:
            >>> v = larql.edit_vindex("g.vindex")
            >>> report = v.insert(larql.Fact("France", "The capital of France is", "Lisbon", "capital"))
            >>> v.model().generate("The capital of France is", max_new_tokens=2).text
        """
        from larql.edit.insert import insert_facts
        from larql.edit.methods.facts import Fact

        return insert_facts(self, [facts] if isinstance(facts, Fact) else list(facts), method, **options)

    def __repr__(self) -> str:
        return f"EditableVindex({self.store!r}, edited_features={len(self.overlay)})"


def edit_vindex(path: str | Path) -> EditableVindex:
    """Open the vindex at `path` read-only and wrap it in an editable view with an empty overlay."""
    return EditableVindex(open_vindex(path))
