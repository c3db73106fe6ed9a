"""LARQL's vindexes (the Rust original's: index.json version 2 and its files, as
larql-reference.md §3 and vindex_spec/CONVERT.md describe them) read at the browse level and written
as a larql vindex: `larql convert SRC OUT.vindex`.

Read: `gate_vectors.bin` (f16 or f32, each layer's block at index.json's `layers[].offset/length`),
`embeddings.bin`, `down_meta.bin` (a `DMET` header, then per layer a u32 count and fixed records
`u32 top_token_id, f32 c_score, top_k x (u32 id, f32 logit)`) or the legacy `down_meta.jsonl`,
`tokenizer.json` (copied byte for byte), and the relation labels (`relation_clusters.json`,
`feature_clusters.jsonl`, `feature_labels.json`) when present. Every size is checked against
index.json or the header before anything is read; NaN and infinite values, counts that run past
the file and token ids outside the vocabulary are refused. What cannot be converted is refused by
name: the model's weights (attn_weights.bin, ...: browse level only), quantized-only gate vectors,
per-layer FFN files (`layers/`), and the KNN store of LARQL's INSERTs.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import LarqlError, VindexError
from larql.io.jsonfile import parse_json, read_bounded, read_json
from larql.io.pathguard import overlap
from larql.model.config import ModelConfig, check_config
from larql.version import __version__
from larql.vindex import layout
from larql.vindex.check import MAX_INDEX_BYTES, MAX_JSON_DEPTH, is_larql_index
from larql.vindex.integrity import sha256_path
from larql.vindex.writer import VindexWriter

Progress = Callable[[str, int, int], None]

DMET_MAGIC = 0x444D4554  # down_meta.bin's first u32; LARQL's reader also takes it byte-reversed
DMET_VERSION = 1
DMET_HEADER = 16  # magic, version, num_layers, top_k: 4 x u32
DOWN_META_JSONL = "down_meta.jsonl"  # LARQL's legacy down_meta: {l, f, t, i, c, k: [{t, i, s}]} per line
LABELS_JSON = "feature_labels.json"  # LARQL's probe labels: {"L26_F9515": "capital"} (or "26:9515")
MAX_TOKENIZER_BYTES = 1 << 30
MAX_LABELS_BYTES = 256 << 20
MAX_CLUSTERS_BYTES = 1 << 30
MAX_LINE_BYTES = 1 << 20  # one feature's JSONL line: a few hundred bytes
ROWS = 1 << 14  # rows copied per step

# LARQL's files holding the model's weights (inference level and up, and the quantized forms)
WEIGHT_FILES = ("attn_weights.bin", "norms.bin", "up_weights.bin", "down_weights.bin", "lm_head.bin",
                "weight_manifest.json", "up_features.bin", "down_features.bin", "interleaved.bin",
                "interleaved_q4.bin", "interleaved_q4k.bin", "interleaved_q4k_manifest.json",
                "interleaved_q4_manifest.json", "attn_weights_q4k.bin", "attn_weights_q4k_manifest.json",
                "attn_weights_q8.bin", "attn_weights_q4.bin", "down_features_q4k.bin",
                "down_features_q4k_manifest.json", "lm_head_q4.bin", "up_features_fp4.bin",
                "down_features_fp8.bin", "fp4_compliance.json", "ple_weights.bin", "router_weights.bin")
QUANT_GATES = ("gate_vectors_q4.bin", "gate_vectors_fp4.bin")
EDIT_FILES = ("knn_store.bin", "memit_store.json")  # LARQL's INSERT ... MODE KNN store, COMPACT MAJOR's pairs
PER_LAYER_DIR = "layers"  # layers/layer_{LL}.weights, with ffn_layout "per_layer"
WEIGHTS_ADVICE = ("browse level only; the model's weights are not converted; extract the model with `larql extract` "
                  "for inference")


def is_larql_vindex(path: str | Path) -> bool:
    """Whether `path` is a directory holding LARQL's index.json (version 2)."""
    index = Path(path) / layout.INDEX_FILE
    if not index.is_file():
        return False
    try:
        return is_larql_index(read_json(index, MAX_INDEX_BYTES, MAX_JSON_DEPTH, "LARQL vindex index"))
    except LarqlError:
        return False


# -- index.json ---------------------------------------------------------------------------------


def _int(doc: dict[str, Any], key: str, where: str, low: int, high: int, default: int | None = None) -> int:
    v = doc.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
        raise VindexError(f"{where}: {key} is {str(v)[:40]!r}; expected an integer in {low}..{high:,}")
    return v


def _number(doc: dict[str, Any], key: str, where: str, default: float) -> float:
    v = doc.get(key, default)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise VindexError(f"{where}: {key} is {str(v)[:40]!r}; expected a finite number")
    return float(v)


def _dtype(index: dict[str, Any], where: str) -> str:
    dtype = index.get("dtype", "f32")  # LARQL's default when the field is missing (version 1)
    if dtype not in layout.DTYPES:
        raise VindexError(f"{where}: dtype {str(dtype)[:20]!r}; LARQL writes f32 or f16")
    return str(dtype)


def _bands(index: dict[str, Any], n: int, where: str) -> dict[str, list[int]]:
    """LARQL's layer bands when it states them (inclusive, inside the layers), else computed."""
    bands = index.get("layer_bands")
    if bands is None:
        return layout.layer_bands(n)
    if not isinstance(bands, dict):
        raise VindexError(f"{where}: layer_bands is not an object")
    out = layout.layer_bands(n)
    for name in out:
        r = bands.get(name)
        if r is None:
            continue
        if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in r)
                and 0 <= r[0] <= r[1] < n):
            raise VindexError(f"{where}: layer_bands.{name} is {str(r)[:40]}; expected [a, b] with 0 <= a <= b < {n}")
        out[name] = [int(r[0]), int(r[1])]
    return out


def read_index(src: Path) -> dict[str, Any]:
    """LARQL's index.json, bounded and checked: version 2, the sizes, a layer table of one entry per
    layer in order. The fields read are returned normalized; `layers` entries as
    `{num_features, offset, length, num_experts}`."""
    where = str(src / layout.INDEX_FILE)
    index = read_json(src / layout.INDEX_FILE, MAX_INDEX_BYTES, MAX_JSON_DEPTH, "LARQL vindex index")
    if not is_larql_index(index):
        got = index.get("version") if isinstance(index, dict) else None
        raise VindexError(f"{where}: not LARQL's index.json (version {got!r}, expected version "
                          f"{layout.ORIGINAL_INDEX_VERSION} without a `format` field)")
    n = _int(index, "num_layers", where, 1, 4096)
    hidden = _int(index, "hidden_size", where, 1, 1 << 20)
    ffn = _int(index, "intermediate_size", where, 1, 1 << 22)
    vocab = _int(index, "vocab_size", where, 1, 1 << 24)
    dtype = _dtype(index, where)
    itemsize = np.dtype(layout.DTYPES[dtype]).itemsize
    layers = index.get("layers")
    if not isinstance(layers, list) or len(layers) != n:
        raise VindexError(f"{where}: layers must list {n} entries (num_layers), one per layer")
    table = []
    for i, e in enumerate(layers):
        at = f"{where}: layers[{i}]"
        if not isinstance(e, dict) or e.get("layer") != i:
            raise VindexError(f"{at}: expected the entry of layer {i} (layers in order)")
        nf = _int(e, "num_features", at, 0, 1 << 26)
        experts = _int(e, "num_experts", at, 1, 1 << 12, 1)  # a mixture of experts: every expert's rows
        per = _int(e, "num_features_per_expert", at, 1, 1 << 22, nf // experts) if experts > 1 else nf
        if nf != experts * per:
            raise VindexError(f"{at}: {nf} features, not num_experts x num_features_per_expert ({experts} x {per})")
        if experts == 1 and nf != ffn:
            raise VindexError(f"{at}: {nf} features, but intermediate_size is {ffn}: larql's vindex holds that many "
                              f"features in every layer, so this one cannot be converted")
        offset = _int(e, "offset", at, 0, 1 << 62)
        length = _int(e, "length", at, 0, 1 << 62)
        if length != nf * hidden * itemsize:
            raise VindexError(f"{at}: length {length} bytes, but {nf} features x hidden {hidden} x {dtype} is "
                              f"{nf * hidden * itemsize}")
        table.append({"num_features": nf, "offset": offset, "length": length, "num_experts": experts,
                      "per_expert": per})
    layouts = sorted({(e["num_experts"], e["per_expert"]) for e in table})
    if len(layouts) > 1:
        raise VindexError(f"{where}: layers with different numbers of experts or features "
                          f"({', '.join(f'{a} x {b}' for a, b in layouts)}); "
                          f"larql's vindex has one layout for every layer")
    mc = index.get("model_config", {})
    if not isinstance(mc, dict):
        raise VindexError(f"{where}: model_config is not an object")
    family = index.get("family") or mc.get("model_type") or "unknown"
    model = index.get("model") or src.name
    if not isinstance(family, str) or not isinstance(model, str):
        raise VindexError(f"{where}: model and family must be strings")
    return {"model": model, "family": family, "num_layers": n, "hidden_size": hidden,
            "intermediate_size": layouts[0][1], "n_experts": layouts[0][0],
            "vocab_size": vocab, "dtype": dtype, "embed_scale": _number(index, "embed_scale", where, 1.0),
            "down_top_k": _int(index, "down_top_k", where, 1, 1000, 10), "layer_bands": _bands(index, n, where),
            "layers": table, "model_config": mc, "extract_level": index.get("extract_level"),
            "ffn_layout": index.get("ffn_layout")}


def model_config(info: dict[str, Any], where: str) -> dict[str, Any]:
    """larql's model_config for a converted vindex: LARQL's model_config fields where it states them,
    larql's defaults otherwise. Descriptive only: a converted vindex is browse level, never run."""
    mc, n, hidden = info["model_config"], info["num_layers"], info["hidden_size"]
    at = f"{where}: model_config"
    heads = _int(mc, "num_q_heads", at, 1, 4096, 1)
    head_dim = _int(mc, "head_dim", at, 1, 1 << 16, max(hidden // heads, 1))
    window = _int(mc, "sliding_window", at, 0, 1 << 24, 0) if mc.get("sliding_window") is not None else 0
    types = mc.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        global_layers = tuple(t != "sliding_attention" for t in types)
    else:
        global_layers = (True,) * n
    rope = _number(mc, "rope_base", at, 10000.0)
    scalar = _number(mc, "query_pre_attn_scalar", at, float(head_dim))
    gemma = info["family"].startswith("gemma")
    moe = mc.get("moe") if isinstance(mc.get("moe"), dict) else {}
    cfg = ModelConfig(
        arch=info["family"], n_layers=n, hidden=hidden, ffn=info["intermediate_size"], n_heads=heads,
        n_kv_heads=_int(mc, "num_kv_heads", at, 1, 4096, heads), head_dim=head_dim, vocab=info["vocab_size"],
        context_length=4096, norm_eps=1e-6, rope_base=rope,
        rope_base_local=_number(mc, "rope_local_base", at, rope), rope_interleaved=False, sliding_window=window,
        global_layers=global_layers, embed_scale=info["embed_scale"], attn_scale=scalar ** -0.5 if scalar > 0 else 1.0,
        qk_norm=gemma, sandwich_norms=gemma, activation="gelu_tanh" if gemma else "silu",
        final_softcap=max(_number(mc, "final_logit_softcapping", at, 0.0), 0.0), attn_softcap=0.0,
        tied_embeddings=True, n_experts=info["n_experts"] if info["n_experts"] > 1 else 0,
        n_experts_used=_int(moe, "top_k", at, 0, 1 << 12, 0) if info["n_experts"] > 1 else 0)
    try:
        check_config(cfg, at)
    except LarqlError as e:
        raise VindexError(str(e)) from None
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}


# -- what is refused --------------------------------------------------------------------------


def refuse_unconvertible(src: Path, info: dict[str, Any], level: str | None) -> list[str]:
    """Raise for what cannot be converted; returns the weight files skipped (only with level browse)."""
    for name in EDIT_FILES:
        if (src / name).exists():
            raise VindexError(f"{src / name}: LARQL's stored INSERT edits, which larql has no form of; convert a copy "
                              f"of the vindex without {name}, then make the edits again in larql (INSERT, patches)")
    if not (src / layout.GATE_FILE).is_file():
        quant = next((q for q in QUANT_GATES if (src / q).exists()), None)
        if quant is not None:
            raise VindexError(f"{src / quant}: LARQL's quantized gate vectors, and no {layout.GATE_FILE} (f16/f32) "
                              f"beside them; larql converts float gates only: extract the model with `larql extract`")
        raise VindexError(f"{src / layout.GATE_FILE}: missing; a LARQL vindex without gate vectors cannot be converted")
    weights = [n for n in WEIGHT_FILES if (src / n).exists()]
    if (src / PER_LAYER_DIR).is_dir() or info["ffn_layout"] == "per_layer":
        first = sorted((src / PER_LAYER_DIR).glob("*")) if (src / PER_LAYER_DIR).is_dir() else []
        weights.append(str(Path(PER_LAYER_DIR) / first[0].name) if first else PER_LAYER_DIR + "/")
    if weights and level != "browse":
        more = f" (and {len(weights) - 1} more)" if len(weights) > 1 else ""
        raise VindexError(f"{src / weights[0]}{more}: {WEIGHTS_ADVICE}; pass --level browse to convert the rest")
    if level not in (None, "browse"):
        raise VindexError(f"--level {level}: a LARQL vindex converts at the browse level only; {WEIGHTS_ADVICE}")
    return weights


# -- the binary files ---------------------------------------------------------------------------


def _map(path: Path) -> NDArray[np.uint8]:
    return np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)


def _finite(a: NDArray[Any], where: str, what: str) -> None:
    if not np.isfinite(a).all():
        raise VindexError(f"{where}: {what} holds NaN or infinite values")


def _cast(a: NDArray[Any], dtype: str, where: str) -> NDArray[Any]:
    out = a.astype(layout.DTYPES[dtype])
    if dtype == "f16" and not np.isfinite(out).all():
        raise VindexError(f"{where}: values too large for f16; convert with --dtype f32")
    return out


def dmet_layers(path: Path, n_layers: int, features: list[int], vocab: int) -> tuple[int, Iterator[tuple[NDArray[np.uint32], NDArray[np.float32]]]]:
    """(top_k, per layer (ids, logits) `[features, top_k]`) of LARQL's down_meta.bin, every count and
    size checked against the header and index.json before its bytes are read, each record's ids in
    the vocabulary and its scores finite."""
    raw = _map(path)
    size = len(raw)
    if size < DMET_HEADER:
        raise VindexError(f"{path}: {size} bytes, shorter than its {DMET_HEADER}-byte header (truncated)")
    magic, version, layers, top_k = (int(v) for v in raw[:DMET_HEADER].view("<u4"))
    if magic not in (DMET_MAGIC, int.from_bytes(DMET_MAGIC.to_bytes(4, "little"), "big")):
        raise VindexError(f"{path}: bad magic 0x{magic:08x} (expected DMET, 0x{DMET_MAGIC:08x} in either byte order)")
    if version != DMET_VERSION:
        raise VindexError(f"{path}: down_meta version {version}; LARQL's is {DMET_VERSION}")
    if layers != n_layers:
        raise VindexError(f"{path}: header says {layers} layers, index.json {n_layers}")
    if not 1 <= top_k <= 1000:
        raise VindexError(f"{path}: header top_k is {top_k}; expected 1..1000")
    record = np.dtype([("top", "<u4"), ("c", "<f4"), ("k", [("id", "<u4"), ("logit", "<f4")], (top_k,))])
    # walk the counts first: every layer's bytes are inside the file before any record is read
    starts, pos = [], DMET_HEADER
    for i, nf in enumerate(features):
        if pos + 4 > size:
            raise VindexError(f"{path}: truncated at layer {i}'s feature count (offset {pos} of {size} bytes)")
        count = int(raw[pos:pos + 4].view("<u4")[0])
        if count >= 1 << 31:
            raise VindexError(f"{path}: layer {i} feature count {count - (1 << 32)} is negative")
        if count != nf:
            raise VindexError(f"{path}: layer {i} has {count} records, index.json says {nf} features")
        if pos + 4 + count * record.itemsize > size:
            raise VindexError(f"{path}: layer {i}'s {count} records of {record.itemsize} bytes run past the end of "
                              f"the file ({size} bytes; truncated)")
        starts.append(pos + 4)
        pos += 4 + count * record.itemsize
    if pos != size:
        raise VindexError(f"{path}: {size - pos} bytes after the last layer's records (expected {pos} bytes in all)")

    def layers_of() -> Iterator[tuple[NDArray[np.uint32], NDArray[np.float32]]]:
        for i, (start, nf) in enumerate(zip(starts, features, strict=True)):
            recs = raw[start:start + nf * record.itemsize].view(record)
            ids = np.ascontiguousarray(recs["k"]["id"]).reshape(nf, top_k)
            logits = np.ascontiguousarray(recs["k"]["logit"]).reshape(nf, top_k)
            for name, values in (("top_token_id", recs["top"]), ("token id", ids)):
                if values.size and int(values.max()) >= vocab:
                    raise VindexError(f"{path}: layer {i} has a {name} {int(values.max())} outside the vocabulary "
                                      f"(0..{vocab - 1})")
            _finite(recs["c"], str(path), f"layer {i}'s c_score")
            _finite(logits, str(path), f"layer {i}'s logits")
            yield ids.astype(np.uint32), logits.astype(np.float32)

    return top_k, layers_of()


def jsonl_layers(path: Path, features: list[int], vocab: int, top_k: int) -> list[tuple[NDArray[np.uint32], NDArray[np.float32]]]:
    """LARQL's legacy down_meta.jsonl: one `{l, f, t, i, c, k: [{t, i, s}]}` per feature (a feature
    without a line is all zeros, as in down_meta.bin); at most `top_k` entries per feature."""
    ids = [np.zeros((nf, top_k), np.uint32) for nf in features]
    scores = [np.zeros((nf, top_k), np.float32) for nf in features]
    seen: set[tuple[int, int]] = set()
    with open(path, "rb") as f:
        for n, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            where = f"{path}:{n}"
            if len(line) > MAX_LINE_BYTES:
                raise VindexError(f"{where}: a line longer than {MAX_LINE_BYTES:,} bytes; not LARQL's down_meta.jsonl")
            if not line.strip():
                continue
            rec = parse_json(line.decode("utf-8", "replace"), where, 8, "LARQL down_meta.jsonl")
            if not isinstance(rec, dict):
                raise VindexError(f"{where}: not a JSON object")
            layer = _int(rec, "l", where, 0, len(features) - 1)
            feature = _int(rec, "f", where, 0, max(features[layer] - 1, 0))
            if features[layer] == 0 or (layer, feature) in seen:
                raise VindexError(f"{where}: layer {layer} feature {feature} {'again' if features[layer] else 'is not in the vindex'}")
            seen.add((layer, feature))
            _int(rec, "i", where, 0, vocab - 1, 0)
            _number(rec, "c", where, 0.0)
            entries = rec.get("k", [])
            if not isinstance(entries, list) or len(entries) > top_k:
                raise VindexError(f"{where}: k must be a list of at most {top_k} entries (down_top_k)")
            for j, e in enumerate(entries):
                if not isinstance(e, dict):
                    raise VindexError(f"{where}: k[{j}] is not an object")
                ids[layer][feature, j] = _int(e, "i", f"{where}: k[{j}]", 0, vocab - 1)
                scores[layer][feature, j] = _number(e, "s", f"{where}: k[{j}]", 0.0)
    return list(zip(ids, scores, strict=True))


# -- labels -------------------------------------------------------------------------------------

_LABEL_KEY = re.compile(r"^(?:L(\d+)_F(\d+)|(\d+):(\d+))$")


def labels_jsonl(path: Path, features: list[int]) -> str:
    """LARQL's feature_labels.json (`{"L26_F9515": "capital"}`; its spec's `"26:9515"` too) as
    larql's feature_labels.jsonl: one `{l, f, label}` per feature, sorted."""
    doc = parse_json(read_bounded(path, MAX_LABELS_BYTES, "LARQL feature labels").decode("utf-8", "replace"),
                     str(path), 4, "LARQL feature labels")
    if not isinstance(doc, dict):
        raise VindexError(f"{path}: not a JSON object of labels")
    out = {}
    for key, label in doc.items():
        m = _LABEL_KEY.match(key)
        if m is None or not isinstance(label, str):
            raise VindexError(f"{path}: entry {key[:40]!r}: expected \"L<layer>_F<feature>\": \"label\"")
        layer, feature = (int(x) for x in (m.group(1, 2) if m.group(1) else m.group(3, 4)))
        if layer >= len(features) or feature >= features[layer]:
            raise VindexError(f"{path}: {key} is not a feature of the vindex")
        out[(layer, feature)] = label
    return "".join(json.dumps({"l": l, "f": f, "label": t}) + "\n" for (l, f), t in sorted(out.items()))


def clusters_files(src: Path, hidden: int, features: list[int]) -> dict[str, str]:
    """relation_clusters.json and feature_clusters.jsonl, LARQL's and larql's alike, checked and rewritten."""
    path = src / layout.CLUSTERS_FILE
    doc = parse_json(read_bounded(path, MAX_CLUSTERS_BYTES, "relation clusters").decode("utf-8", "replace"),
                     str(path), 4, "relation clusters")
    k = doc.get("k") if isinstance(doc, dict) else None
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise VindexError(f"{path}: expected an object with a cluster count k")
    for key in ("centres", "labels", "counts", "top_tokens"):
        if not isinstance(doc.get(key), list) or len(doc[key]) != k:
            raise VindexError(f"{path}: {key} must list k = {k} entries")
    centres = np.asarray(doc["centres"], dtype=np.float64) if k else np.zeros((0, hidden))
    if centres.shape != (k, hidden):
        raise VindexError(f"{path}: centres must be {k} x {hidden} (hidden_size)")
    _finite(centres, str(path), "centres")
    if not all(isinstance(t, str) for t in doc["labels"]):
        raise VindexError(f"{path}: labels must be strings")
    out = {layout.CLUSTERS_FILE: json.dumps({"k": k, "centres": doc["centres"], "labels": doc["labels"],
                                            "counts": doc["counts"], "top_tokens": doc["top_tokens"]})}
    members = src / layout.FEATURE_CLUSTERS_FILE
    lines = []
    if members.is_file():
        for n, line in enumerate(read_bounded(members, MAX_CLUSTERS_BYTES, "feature clusters").splitlines(), 1):
            if not line.strip():
                continue
            where = f"{members}:{n}"
            rec = parse_json(line.decode("utf-8", "replace"), where, 2, "feature clusters")
            if not isinstance(rec, dict):
                raise VindexError(f"{where}: not a JSON object")
            layer = _int(rec, "l", where, 0, len(features) - 1)
            feature = _int(rec, "f", where, 0, max(features[layer] - 1, 0))
            c = _int(rec, "c", where, 0, max(k - 1, 0))
            lines.append(json.dumps({"l": layer, "f": feature, "c": c}) + "\n")
    out[layout.FEATURE_CLUSTERS_FILE] = "".join(lines)
    return out


def tokenizer_ids(src: Path, vocab: int) -> dict[str, Any]:
    """{bos_id, eos_ids} from LARQL's generation_config.json when it copied one, else none."""
    gen = src / "generation_config.json"
    doc = read_json(gen, 1 << 20, 16, "generation config") if gen.is_file() else {}
    doc = doc if isinstance(doc, dict) else {}
    bos, eos = doc.get("bos_token_id"), doc.get("eos_token_id", [])
    eos = [eos] if isinstance(eos, int) else eos

    def ok(t: Any) -> bool:
        return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab

    if (bos is not None and not ok(bos)) or not isinstance(eos, list) or not all(ok(t) for t in eos):
        raise VindexError(f"{gen}: bos_token_id / eos_token_id must be token ids below {vocab:,}")
    return {"bos_id": bos, "eos_ids": list(eos)}


# -- conversion ---------------------------------------------------------------------------------


def convert_larql(src: str | Path, out: str | Path, dtype: str | None = None, level: str | None = None,
                  overwrite: bool = False, progress: Progress | None = None) -> Path:
    """Convert the LARQL vindex `src` into the larql vindex `out` (browse level), atomically.

    Args:
        dtype: f16 or f32 for embeddings and gates (default: the source's).
        level: None or "browse". A source holding the model's weights (attn_weights.bin, ...) is
            refused unless level is "browse": the weights are not converted, and saying so is the
            user's choice.

    Example:
        >>> convert_larql("gemma-3-4b-it.vindex", "gemma.vindex", level="browse")
    """
    src, out = Path(src), Path(out)
    report = progress or (lambda stage, done, total: None)
    if not (src / layout.INDEX_FILE).is_file():
        raise VindexError(f"{src}: not a vindex (no {layout.INDEX_FILE})")
    refused = overlap(out, [(src, "the LARQL vindex converted")])
    if refused is not None:
        raise VindexError(f"{refused}; write the output somewhere else")
    info = read_index(src)
    refuse_unconvertible(src, info, level)
    if dtype is not None and dtype not in layout.DTYPES:
        raise VindexError(f"--dtype {dtype}: a vindex holds f16 or f32")
    where = str(src / layout.INDEX_FILE)
    n, hidden, vocab, source_dtype = info["num_layers"], info["hidden_size"], info["vocab_size"], info["dtype"]
    dtype = dtype or source_dtype
    src_np = np.dtype(layout.DTYPES[source_dtype]).newbyteorder("<")
    features = [e["num_features"] for e in info["layers"]]

    gate_path, embed_path = src / layout.GATE_FILE, src / layout.EMBEDDINGS_FILE
    gate_size = gate_path.stat().st_size
    for i, e in enumerate(info["layers"]):
        if e["offset"] + e["length"] > gate_size:
            raise VindexError(f"{gate_path}: layer {i}'s block ({e['offset']}+{e['length']} bytes) runs past the end "
                              f"of the file ({gate_size} bytes; truncated)")
    if not embed_path.is_file():
        raise VindexError(f"{embed_path}: missing; a LARQL vindex without embeddings cannot be converted")
    if embed_path.stat().st_size != vocab * hidden * src_np.itemsize:
        raise VindexError(f"{embed_path}: {embed_path.stat().st_size} bytes, but vocab_size x hidden_size x "
                          f"{source_dtype} is {vocab * hidden * src_np.itemsize}")
    tok_path = src / layout.TOKENIZER_FILE
    if not tok_path.is_file():
        raise VindexError(f"{tok_path}: missing; a vindex's tokens are read through it")
    tokenizer = read_bounded(tok_path, MAX_TOKENIZER_BYTES, "tokenizer")
    try:
        from tokenizers import Tokenizer

        tok_vocab = Tokenizer.from_str(tokenizer.decode("utf-8")).get_vocab_size()
    except Exception as err:
        raise VindexError(f"{tok_path}: not a tokenizers JSON ({str(err)[:200]})") from None
    if tok_vocab > vocab:
        raise VindexError(f"{tok_path}: {tok_vocab:,} tokens, more than vocab_size {vocab:,}: its ids would fall "
                          f"outside the embeddings")
    dm_path = src / "down_meta.bin"
    if dm_path.is_file():
        top_k, down_layers = dmet_layers(dm_path, n, features, vocab)
        down: Iterator[tuple[NDArray[np.uint32], NDArray[np.float32]]] = down_layers
    elif (src / DOWN_META_JSONL).is_file():
        top_k = info["down_top_k"]
        down = iter(jsonl_layers(src / DOWN_META_JSONL, features, vocab, top_k))
    else:
        raise VindexError(f"{dm_path}: missing (and no legacy {DOWN_META_JSONL}); a vindex's features need it")
    extras: dict[str, str] = {}
    if (src / layout.CLUSTERS_FILE).is_file():
        extras.update(clusters_files(src, hidden, features))
    if (src / LABELS_JSON).is_file():
        extras[layout.FEATURE_LABELS_FILE] = labels_jsonl(src / LABELS_JSON, features)
    mc = model_config(info, where)
    tok_ids = tokenizer_ids(src, vocab)
    source_sha, source_size = sha256_path(src)

    with VindexWriter(out, overwrite=overwrite) as w:
        w.text(layout.TOKENIZER_FILE, tokenizer.decode("utf-8"))
        emb_src = _map(embed_path).view(src_np).reshape(vocab, hidden)
        emb = w.binary(layout.EMBEDDINGS_FILE)
        for start in range(0, vocab, ROWS):
            rows = np.asarray(emb_src[start:start + ROWS])
            _finite(rows, str(embed_path), f"rows {start}..{start + len(rows) - 1}")
            emb.write(_cast(rows, dtype, str(embed_path)))
            report("embeddings", min(start + ROWS, vocab), vocab)
        gates, dm = w.binary(layout.GATE_FILE), w.binary(layout.DOWN_META_FILE)
        header = layout.DOWN_META_MAGIC + np.array([layout.DOWN_META_VERSION, n, top_k], "<u4").tobytes()
        dm.write(header.ljust(layout.DOWN_META_HEADER, b"\0"))
        gate_raw, layers = _map(gate_path), []
        for i, (e, (ids, scores)) in enumerate(zip(info["layers"], down, strict=True)):
            nf = e["num_features"]
            gate = np.asarray(gate_raw[e["offset"]:e["offset"] + e["length"]].view(src_np)).reshape(nf, hidden)
            _finite(gate, str(gate_path), f"layer {i}'s gate vectors")
            gate_offset = gates.write_aligned(_cast(gate, dtype, str(gate_path)))
            dm_offset = dm.write_aligned(ids)
            dm.write(scores)
            layers.append({"layer": i, "num_features": nf, "gate_offset": gate_offset,
                           "gate_length": nf * hidden * np.dtype(layout.DTYPES[dtype]).itemsize,
                           "down_meta_offset": dm_offset, "down_meta_length": int(ids.nbytes + scores.nbytes),
                           **({"num_experts": e["num_experts"]} if e["num_experts"] > 1 else {})})
            report("gate vectors + down_meta", i + 1, n)
        for name, text in extras.items():
            w.text(name, text)
        index = {
            "format": layout.FORMAT_NAME, "version": layout.FORMAT_VERSION, "larql_version": __version__,
            "model": info["model"], "family": info["family"],
            "source": {"path": str(src.resolve()), "sha256": source_sha, "size": source_size,
                       "extracted_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")},
            "extract_level": "browse", "dtype": dtype, "quant": "none", "num_layers": n, "hidden_size": hidden,
            "intermediate_size": info["intermediate_size"], "vocab_size": vocab, "embed_scale": info["embed_scale"],
            "down_top_k": top_k, "has_model_weights": False, "layer_bands": info["layer_bands"], "layers": layers,
            "model_config": mc, "tokenizer": tok_ids,
        }
        return w.finish(index)
