"""Vindex layout constants: the only place they are defined. They mirror vindex_spec/FORMAT.md,
and a test reads FORMAT.md to check that they still agree."""

from __future__ import annotations

FORMAT_NAME = "larql-vindex"
FORMAT_VERSION = 1
ALIGNMENT = 64  # every binary block starts at a multiple of this many bytes

INDEX_FILE = "index.json"
TOKENIZER_FILE = "tokenizer.json"
EMBEDDINGS_FILE = "embeddings.bin"
GATE_FILE = "gate_vectors.bin"
DOWN_META_FILE = "down_meta.bin"
WEIGHTS_FILE = "weights.bin"
MANIFEST_FILE = "weights.json"
CLUSTERS_FILE = "relation_clusters.json"  # optional: written when there are enough features to cluster
FEATURE_CLUSTERS_FILE = "feature_clusters.jsonl"
FEATURE_LABELS_FILE = "feature_labels.jsonl"  # optional: labels given by hand (a Vindexfile's LABELS)
BROWSE_FILES = (TOKENIZER_FILE, EMBEDDINGS_FILE, GATE_FILE, DOWN_META_FILE)
INFERENCE_FILES = (WEIGHTS_FILE, MANIFEST_FILE)

DOWN_META_MAGIC = b"LQDM"
DOWN_META_VERSION = 1
DOWN_META_HEADER = 64  # bytes: magic, u32 version, u32 num_layers, u32 top_k, zero padding

LEVELS = ("browse", "inference", "all")
# LARQL's (the Rust original's) index.json says `version` 2 and has no `format`: larql converts such a
# vindex (`larql convert`, larql/vindex/larql_import.py) and never opens it as it is
ORIGINAL_INDEX_VERSION = 2
# numpy dtype names (strings, so that the CLI and the planner read these constants without numpy)
DTYPES: dict[str, str] = {"f16": "float16", "f32": "float32"}
# the defaults of `larql extract` and of EXTRACT MODEL ... INTO: one set, read by both
EXTRACT_DEFAULTS: dict[str, str | int] = {"level": "browse", "dtype": "f16", "quant": "source", "top_k": 10}
# DESCRIBE's feature edges (LARQL's): gate KNN hits per layer, and the gate score below which a hit
# is not an edge (weaker, and all negative, scores); here so that the planner reads them without numpy
DESCRIBE_HITS_PER_LAYER = 20
DESCRIBE_MIN_GATE = 5.0


def describe_layers(layer_bands: dict[str, list[int]], num_layers: int, band: str | None,
                    at_layer: int | None) -> list[int]:
    """The layers DESCRIBE queries: AT LAYER n, else the band's (syntax, knowledge, output), else all."""
    if at_layer is not None:
        return [at_layer]
    if band is not None and band in layer_bands:
        lo, hi = layer_bands[band]
        return list(range(lo, hi + 1))
    return list(range(num_layers))


def align(offset: int) -> int:
    """The first multiple of ALIGNMENT at or after `offset`."""
    return -(-offset // ALIGNMENT) * ALIGNMENT


def layer_bands(n_layers: int) -> dict[str, list[int]]:
    """Syntax / knowledge / output layer ranges (inclusive): the first two fifths, the next two,
    the last fifth (LARQL's fallback rule; its per-family tables agree with it to a layer or two)."""
    a, b = 2 * n_layers // 5, 4 * n_layers // 5
    if n_layers < 5:
        return {"syntax": [0, 0], "knowledge": [0, n_layers - 1], "output": [n_layers - 1, n_layers - 1]}
    return {"syntax": [0, a - 1], "knowledge": [a, b - 1], "output": [b, n_layers - 1]}
