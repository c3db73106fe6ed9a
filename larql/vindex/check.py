"""What opening a vindex checks before it answers: index.json parses, fits its schema, agrees with
itself and with the files' sizes, carries an intact seal, and every file's bytes hash to what it
records (integrity.py). Each failure is one VindexError naming the file and the fix."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from larql.errors import VindexError
from larql.io.jsonfile import read_json
from larql.vindex import integrity, layout

MAX_INDEX_BYTES = 64 << 20  # an index.json is tens of KB; a bigger one is not ours
MAX_JSON_DEPTH = 32  # index.json nests 4 deep; bound it before the parser recurses


@lru_cache(maxsize=1)
def _schema_validator() -> Any:
    import jsonschema

    schema = json.loads((Path(__file__).with_name("index.schema.json")).read_text())
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def validate_index(index: Any, where: str) -> None:
    """Raise VindexError naming the first schema violation of an index.json document."""
    errors = sorted(_schema_validator().iter_errors(index), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        at = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise VindexError(f"{where}: index.json fails its schema at {at}: {e.message}")


def is_larql_index(index: Any) -> bool:
    """Whether an index.json document is LARQL's own (VindexConfig version 2, no `format`)."""
    return isinstance(index, dict) and "format" not in index and index.get("version") == layout.ORIGINAL_INDEX_VERSION


def larql_refusal(where: str, source: str) -> str:
    """What opening a LARQL vindex says: larql converts it (once, into a new directory) instead."""
    return (f"{where}: a LARQL vindex (index.json version {layout.ORIGINAL_INDEX_VERSION}), which larql does not open "
            f"as it is; convert it once into a larql vindex (browse level): larql convert {source} OUT.vindex")


def load_index(path: Path) -> dict[str, Any]:
    """index.json, checked by schema, against itself, the files' sizes and its seal (not the files'
    contents: see `check_vindex`)."""
    if not path.is_dir():
        raise VindexError(f"{path}: no such vindex directory")
    index_path = path / layout.INDEX_FILE
    if not index_path.is_file():
        raise VindexError(f"{path}: not a vindex (no {layout.INDEX_FILE})")
    index = read_json(index_path, MAX_INDEX_BYTES, MAX_JSON_DEPTH, "vindex index")
    if is_larql_index(index):  # never converted behind the user's back: a base vindex is read-only
        raise VindexError(larql_refusal(str(path), str(path)))
    validate_index(index, str(index_path))  # from here on index is the object the schema describes
    check_files(path, index)
    check_layers(path, index)
    check_config(path, index)
    integrity.check_seal(index, path)
    return dict(index)


def check_vindex(path: Path) -> dict[str, Any]:
    """Everything opening checks: `load_index`, then every file's bytes against its sha256."""
    index = load_index(path)
    integrity.require_intact(path, index)
    return index


def check_files(path: Path, index: dict[str, Any]) -> None:
    for name, entry in index["files"].items():
        f = path / name
        if Path(name).name != name or name in (".", ".."):
            raise VindexError(f"{path / layout.INDEX_FILE}: file name {name!r} is not a plain name in the vindex")
        if not f.is_file():
            raise VindexError(f"{f}: missing file listed in index.json; {integrity.repair_hint(index, path)}")
        size = f.stat().st_size
        if size != entry["size"]:
            raise VindexError(f"{f}: size {size} bytes, index.json says {entry['size']} (truncated or replaced); "
                              f"{integrity.repair_hint(index, path)}")
    if index["has_model_weights"]:
        for name in layout.INFERENCE_FILES:
            if name not in index["files"]:
                raise VindexError(f"{path}: has_model_weights is true but {name} is not listed")
    itemsize = np.dtype(layout.DTYPES[index["dtype"]]).itemsize
    want = index["vocab_size"] * index["hidden_size"] * itemsize
    if index["files"][layout.EMBEDDINGS_FILE]["size"] != want:
        raise VindexError(f"{path / layout.EMBEDDINGS_FILE}: {index['files'][layout.EMBEDDINGS_FILE]['size']} bytes "
                          f"listed, but vocab_size x hidden_size x {index['dtype']} is {want}")


def _check_blocks(path: Path, layers: list[dict[str, Any]], kind: str, first: int, size: int) -> None:
    """A file's per-layer blocks: in layer order, not overlapping, inside the file."""
    end = first
    for e in layers:
        offset, length = e[f"{kind}_offset"], e[f"{kind}_length"]
        if offset < end:
            raise VindexError(f"{path}: layer {e['layer']} {kind}_offset {offset} overlaps the block before it")
        if offset + length > size:
            raise VindexError(f"{path}: layer {e['layer']} runs past the end of the file")
        end = offset + length


def check_layers(path: Path, index: dict[str, Any]) -> None:
    n, hidden, top_k = index["num_layers"], index["hidden_size"], index["down_top_k"]
    itemsize = np.dtype(layout.DTYPES[index["dtype"]]).itemsize
    layers = index["layers"]
    if len(layers) != n or [e["layer"] for e in layers] != list(range(n)):
        raise VindexError(f"{path}: index.json layers must list layers 0..{n - 1} in order")
    n_experts = index["model_config"].get("n_experts", 0)
    if not isinstance(n_experts, int) or isinstance(n_experts, bool) or n_experts < 0:
        raise VindexError(f"{path / layout.INDEX_FILE}: model_config.n_experts is {n_experts!r}, not a count")
    for e in layers:
        experts = e.get("num_experts", 1)  # a mixture-of-experts layer holds every expert's features
        if experts != max(n_experts, 1):
            raise VindexError(f"{path}: layer {e['layer']} has num_experts {experts}, model_config.n_experts is "
                              f"{n_experts}")
        if e["num_features"] != index["intermediate_size"] * experts:
            per = "" if experts == 1 else f" x {experts} experts"
            raise VindexError(f"{path}: layer {e['layer']} has {e['num_features']} features, "
                              f"intermediate_size{per} is {index['intermediate_size'] * experts}")
        if e["gate_length"] != e["num_features"] * hidden * itemsize:
            raise VindexError(f"{path}: layer {e['layer']} gate_length does not match num_features x hidden")
        if e["down_meta_length"] != e["num_features"] * top_k * 8:
            raise VindexError(f"{path}: layer {e['layer']} down_meta_length does not match num_features x top_k")
    files = index["files"]
    _check_blocks(path / layout.GATE_FILE, layers, "gate", 0, files[layout.GATE_FILE]["size"])
    _check_blocks(path / layout.DOWN_META_FILE, layers, "down_meta", layout.DOWN_META_HEADER,
                  files[layout.DOWN_META_FILE]["size"])
    for band, (a, b) in index["layer_bands"].items():
        if not 0 <= a <= b < n:
            raise VindexError(f"{path}: layer band {band} [{a}, {b}] is outside layers 0..{n - 1}")


# top-level index.json fields and the model_config field each must equal
_SAME = {"num_layers": "n_layers", "hidden_size": "hidden", "intermediate_size": "ffn", "family": "arch",
         "embed_scale": "embed_scale"}


def check_config(path: Path, index: dict[str, Any]) -> None:
    """model_config agrees with the top-level fields, its numbers are finite and its per-layer table
    has one entry per layer; the tokenizer's special ids are in the vocabulary."""
    where = path / layout.INDEX_FILE
    mc = index["model_config"]
    for top, key in _SAME.items():
        if mc.get(key) != index[top]:
            raise VindexError(f"{where}: {top} is {index[top]!r} but model_config.{key} is {mc.get(key)!r}")
    if mc.get("vocab") not in (0, index["vocab_size"]):  # 0: the source did not state it
        raise VindexError(f"{where}: vocab_size is {index['vocab_size']} but model_config.vocab is {mc.get('vocab')}")
    for key, value in mc.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise VindexError(f"{where}: model_config.{key} is {value}, not a finite number")
    if not isinstance(mc.get("global_layers"), list) or len(mc["global_layers"]) != index["num_layers"]:
        raise VindexError(f"{where}: model_config.global_layers must have one entry per layer ({index['num_layers']})")
    tok = index["tokenizer"]
    for t in [tok["bos_id"], *tok["eos_ids"]]:
        if t is not None and not 0 <= t < index["vocab_size"]:
            raise VindexError(f"{where}: tokenizer special id {t} is outside the vocabulary (0..{index['vocab_size'] - 1})")


def check_down_meta_header(path: Path, head: bytes, num_layers: int, top_k: int) -> None:
    where = path / layout.DOWN_META_FILE
    if len(head) < 16 or head[:4] != layout.DOWN_META_MAGIC:
        raise VindexError(f"{where}: bad magic (expected {layout.DOWN_META_MAGIC.decode()})")
    version, n_layers, k = (int(v) for v in np.frombuffer(head[4:16], "<u4"))
    if version != layout.DOWN_META_VERSION:
        raise VindexError(f"{where}: format version {version}, this larql reads {layout.DOWN_META_VERSION}")
    if n_layers != num_layers or k != top_k:
        raise VindexError(f"{where}: header says {n_layers} layers x top {k}, index.json says {num_layers} x {top_k}")
