"""LABELS: feature labels given by hand, written into a vindex as feature_labels.jsonl.

The input is a JSON list of `{"layer": L, "feature": F, "label": "capital-of"}`. The store's
`feature_label` prefers these to the relation-cluster labels, so DESCRIBE, EXPLAIN WALK, SELECT
(`relation`) and DELETE ... WHERE relation = show and match them. Every entry is checked against
the vindex (layer and feature in range, a non-empty label) before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from larql.errors import BuildError
from larql.io.jsonfile import read_json
from larql.vindex import layout
from larql.vindex.store import open_vindex
from larql.vindex.writer import VindexWriter

MAX_LABELS_BYTES = 64 << 20
MAX_LABEL = 200  # characters


def read_labels(path: Path, num_layers: int, num_features: Sequence[int]) -> dict[tuple[int, int], str]:
    """(layer, feature) -> label from one LABELS file, checked against the vindex's sizes."""
    doc = read_json(path, MAX_LABELS_BYTES, 4, "labels", BuildError)
    if not isinstance(doc, list):
        raise BuildError(f'{path}: a labels file is a JSON list of {{"layer", "feature", "label"}} objects')
    out: dict[tuple[int, int], str] = {}
    for n, e in enumerate(doc):
        where = f"{path} entry {n}"
        if not isinstance(e, dict) or set(e) != {"layer", "feature", "label"}:
            raise BuildError(f'{where}: must be {{"layer": L, "feature": F, "label": "text"}}')
        layer, feature, label = e["layer"], e["feature"], e["label"]
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < num_layers:
            raise BuildError(f"{where}: layer must be an integer in 0..{num_layers - 1}, got {layer!r}")
        limit = num_features[layer]
        if not isinstance(feature, int) or isinstance(feature, bool) or not 0 <= feature < limit:
            raise BuildError(f"{where}: feature must be an integer in 0..{limit - 1} at layer {layer}, got {feature!r}")
        if not isinstance(label, str) or not label.strip() or len(label) > MAX_LABEL or "\n" in label:
            raise BuildError(f"{where}: label must be one line of 1..{MAX_LABEL} characters")
        out[(layer, feature)] = label
    return out


def write_labelled(src: Path, out: Path, files: Sequence[Path]) -> Path:
    """A new vindex `out`: `src`'s files (hard-linked) plus its labels merged with those of
    `files`, in order (a later file's label for a feature replaces an earlier one)."""
    v = open_vindex(src)
    labels = dict(v.feature_labels)
    for f in files:
        labels.update(read_labels(f, v.num_layers, [v.num_features(i) for i in range(v.num_layers)]))
    with VindexWriter(out) as w:
        for name, entry in v.index["files"].items():
            if name != layout.FEATURE_LABELS_FILE:
                w.link(name, v.path / name, entry)
        w.text(layout.FEATURE_LABELS_FILE, "".join(json.dumps({"l": l, "f": f, "label": labels[(l, f)]}) + "\n"
                                                   for l, f in sorted(labels)))
        return w.finish({k: val for k, val in v.index.items() if k != "files"})
