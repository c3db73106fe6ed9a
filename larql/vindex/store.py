"""The read-only vindex store: validated on open, every layer a zero-copy view of a memory map."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Self

import numpy as np
from numpy.typing import NDArray

from larql.errors import VindexError
from larql.model.tokenizer import TextTokenizer
from larql.vindex import check, integrity, knn, layout
from larql.vindex.queries import VindexQueries
from larql.vindex.reader import FeatureMeta, feature_meta, feature_name


class Vindex(VindexQueries):
    """An opened vindex, read-only. Build one with `larql.open_vindex(path)`; edits go through an
    editable view over it (`larql.edit.state.view.EditableVindex`), never into the store."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # index.json (schema, consistency, seal) and every file's bytes, before anything is mapped
        self.index: dict[str, Any] = check.check_vindex(self.path)
        self.num_layers: int = self.index["num_layers"]
        self.hidden: int = self.index["hidden_size"]
        self.vocab_size: int = self.index["vocab_size"]
        self.dtype = np.dtype(layout.DTYPES[self.index["dtype"]])
        self.top_k: int = self.index["down_top_k"]
        self._maps: dict[str, NDArray[np.uint8]] = {}  # a memmap, or an empty array for an empty file
        self._gate_indexes: dict[int, Any] = {}  # layer -> faiss index of its gate vectors, built on first KNN
        self._gate_int8: dict[int, knn.Int8Gates] = {}  # layer -> int8 copy of its gates (knn.py), built on first KNN
        self._token_texts: dict[int, str] = {}  # token id -> its text, decoded once
        check.check_down_meta_header(self.path, self._map(layout.DOWN_META_FILE)[: layout.DOWN_META_HEADER].tobytes(),
                                     self.num_layers, self.top_k)

    def verify(self) -> list[str]:
        """Hash every file against index.json, reading each one again (the open-time check may have
        trusted the cache of files already hashed); returns the names that differ (empty: all good)."""
        return integrity.check_contents(self.path, self.index, use_cache=False)

    # -- access -------------------------------------------------------------------------------

    def _map(self, name: str) -> NDArray[np.uint8]:
        if name not in self._maps:
            f = self.path / name
            self._maps[name] = np.memmap(f, dtype=np.uint8, mode="r") if f.stat().st_size else np.zeros(0, np.uint8)
        return self._maps[name]

    @property
    def config(self) -> dict[str, Any]:
        return self.index

    @property
    def has_model_weights(self) -> bool:
        return bool(self.index["has_model_weights"])

    @property
    def embed_scale(self) -> float:
        return float(self.index["embed_scale"])

    def _layer(self, layer: int) -> dict[str, Any]:
        if not isinstance(layer, (int, np.integer)) or not 0 <= layer < self.num_layers:
            raise VindexError(f"{self.path}: layer {layer} out of range 0..{self.num_layers - 1}")
        return self.index["layers"][int(layer)]

    def num_features(self, layer: int) -> int:
        return int(self._layer(layer)["num_features"])

    def feature_ids(self, layer: int) -> Sequence[int]:
        """The layer's features, by id (an editable view adds those METHOD NEURON added)."""
        return range(self.num_features(layer))

    def num_experts(self, layer: int) -> int:
        """How many experts layer `layer`'s features belong to: 0 for a dense FFN."""
        return int(self._layer(layer).get("num_experts", 0))

    def feature_name(self, layer: int, feature: int) -> str:
        return feature_name(self, layer, feature)

    def gate_vectors(self, layer: int) -> NDArray[np.floating]:
        """Layer `layer`'s gate vectors `[features, hidden]`, a read-only view in the stored dtype."""
        e = self._layer(layer)
        raw = self._map(layout.GATE_FILE)[e["gate_offset"]: e["gate_offset"] + e["gate_length"]]
        return raw.view(self.dtype).reshape(e["num_features"], self.hidden)

    @cached_property
    def embeddings(self) -> NDArray[np.floating]:
        """Token embeddings `[vocab, hidden]` (unscaled), a read-only view."""
        return self._map(layout.EMBEDDINGS_FILE).view(self.dtype).reshape(self.vocab_size, self.hidden)

    def down_meta(self, layer: int) -> tuple[NDArray[np.uint32], NDArray[np.float32]]:
        """(token ids `[features, top_k]`, scores `[features, top_k]`) for a layer: read-only views of
        the file (an editable view overlays its edits on these)."""
        e = self._layer(layer)
        n = e["num_features"] * self.top_k
        raw = self._map(layout.DOWN_META_FILE)[e["down_meta_offset"]: e["down_meta_offset"] + e["down_meta_length"]]
        ids = raw[: 4 * n].view("<u4").reshape(-1, self.top_k)
        scores = raw[4 * n:].view("<f4").reshape(-1, self.top_k)
        return ids, scores

    @cached_property
    def tokenizer(self) -> TextTokenizer:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.path / layout.TOKENIZER_FILE))
        meta = self.index["tokenizer"]
        return TextTokenizer(tok, meta["bos_id"], tuple(meta["eos_ids"]))

    @cached_property
    def relation_clusters(self) -> dict[str, Any] | None:
        """relation_clusters.json ({k, centres, labels, counts, top_tokens}), or None if absent."""
        if layout.CLUSTERS_FILE not in self.index["files"]:
            return None
        return json.loads((self.path / layout.CLUSTERS_FILE).read_text())

    def _per_feature(self, name: str, field: str) -> dict[tuple[int, int], Any]:
        """(layer, feature) -> `field` of each `{"l", "f", ...}` line of an optional JSONL file."""
        if name not in self.index["files"]:
            return {}
        recs = (json.loads(line) for line in (self.path / name).read_text().splitlines())
        return {(rec["l"], rec["f"]): rec[field] for rec in recs}

    @cached_property
    def feature_clusters(self) -> dict[tuple[int, int], int]:
        """(layer, feature) -> relation cluster, for the features that were clustered."""
        return self._per_feature(layout.FEATURE_CLUSTERS_FILE, "c")

    @cached_property
    def feature_labels(self) -> dict[tuple[int, int], str]:
        """(layer, feature) -> a label given by hand (feature_labels.jsonl, from a Vindexfile's LABELS)."""
        return self._per_feature(layout.FEATURE_LABELS_FILE, "label")

    def feature_label(self, layer: int, feature: int) -> str | None:
        """A feature's label: the one given by hand if any, else its relation cluster's."""
        given = self.feature_labels.get((int(layer), int(feature)))
        if given is not None:
            return given
        c = self.feature_clusters.get((int(layer), int(feature)))
        clusters = self.relation_clusters
        return None if c is None or clusters is None else clusters["labels"][c]

    def token_text(self, token_id: int) -> str:
        """How a token reads on its own, decoded once and remembered."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.token_text(int(token_id))
        return text

    def feature_meta(self, layer: int, feature: int) -> FeatureMeta:
        return feature_meta(self, layer, feature)

    def token_embedding(self, token_id: int, scaled: bool = True) -> NDArray[np.float32]:
        if not 0 <= token_id < self.vocab_size:
            raise VindexError(f"{self.path}: token id {token_id} out of range 0..{self.vocab_size - 1}")
        row = self.embeddings[token_id].astype(np.float32)
        return row * np.float32(self.embed_scale) if scaled else row

    def entity_embedding(self, text: str, scaled: bool = True) -> NDArray[np.float32]:
        """Mean embedding of the tokens of `text` (no BOS), as DESCRIBE queries with."""
        ids = [i for i in self.tokenizer.tok.encode(text, add_special_tokens=False).ids]
        if not ids:
            raise VindexError(f"{text!r}: tokenizes to nothing")
        rows = self.embeddings[ids].astype(np.float32).mean(axis=0)
        return rows * np.float32(self.embed_scale) if scaled else rows

    def gate_index(self, layer: int) -> Any:
        """The faiss index over a layer's gate vectors, built on first use and kept."""
        if layer not in self._gate_indexes:
            self._gate_indexes[layer] = knn.build_index(self.gate_vectors(layer))
        return self._gate_indexes[layer]

    def gate_int8(self, layer: int) -> knn.Int8Gates:
        """The int8 copy of a layer's gate vectors (knn.py), built on first use and kept."""
        if layer not in self._gate_int8:
            self._gate_int8[layer] = knn.build_int8(self.gate_vectors(layer))
        return self._gate_int8[layer]

    def gate_knn(self, layer: int, query: NDArray[np.float32], k: int = 10) -> list[tuple[int, float]]:
        """The k features whose gate scores `gate . query` are largest in absolute value, sign kept."""
        return knn.gate_knn(self, layer, query, k)

    def close(self) -> None:
        self._maps.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        i = self.index
        return (f"Vindex({str(self.path)!r}, model={i['model']!r}, level={i['extract_level']}, "
                f"layers={self.num_layers}, features={i['intermediate_size']}, dtype={i['dtype']})")


def open_vindex(path: str | Path) -> Vindex:
    """Open a vindex read-only after verifying it (check.check_vindex): index.json by schema, against
    itself, the files and its seal; every file by sha256 (cached per file stat).

    Example:
        >>> v = open_vindex("g.vindex")
        >>> v.gate_knn(10, v.entity_embedding("France"), k=5)
    """
    return Vindex(path)
