"""A vindex written in LARQL's own layout (the Rust original's), following
/work/shared/reference/larql-reference.md §3 exactly, from the arrays of a larql vindex:

- `index.json`: VindexConfig version 2 (§3.2): version, model, family, source{...}, checksums,
  num_layers, hidden_size, intermediate_size, vocab_size, embed_scale, extract_level, dtype, quant,
  layer_bands, layers[{layer, num_features, offset, length}], down_top_k, has_model_weights,
  model_config{model_type, head_dim, num_q_heads, num_kv_heads, rope_base, ...}.
- `gate_vectors.bin`: each layer's `[num_features, hidden]` block, concatenated, no header, dtype.
- `embeddings.bin`: `[vocab, hidden]`, dtype.
- `down_meta.bin`: 4 x u32 header (magic 0x444D4554, version 1, num_layers, top_k), then per layer
  a u32 num_features and that many records `u32 top_token_id, f32 c_score, top_k x (u32 id, f32 logit)`;
  or the legacy `down_meta.jsonl` (`{l, f, t, i, c, k: [{t, i, s}]}` per feature).
- `tokenizer.json` as it is; `feature_labels.json` (`{"L{l}_F{f}": label}`) when labels are given.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

DMET_MAGIC = 0x444D4554


def down_meta_bin(ids: list[np.ndarray], scores: list[np.ndarray], reversed_magic: bool = False) -> bytes:
    top_k = ids[0].shape[1]
    magic = int.from_bytes(DMET_MAGIC.to_bytes(4, "little"), "big") if reversed_magic else DMET_MAGIC
    out = [np.array([magic, 1, len(ids), top_k], "<u4").tobytes()]
    record = np.dtype([("top", "<u4"), ("c", "<f4"), ("k", [("id", "<u4"), ("logit", "<f4")], (top_k,))])
    for i, s in zip(ids, scores, strict=True):
        recs = np.zeros(len(i), record)
        recs["top"], recs["c"] = i[:, 0], s[:, 0]  # top_token and c_score come from the best entry (§4.10)
        recs["k"]["id"], recs["k"]["logit"] = i, s
        out += [np.array([len(i)], "<u4").tobytes(), recs.tobytes()]
    return b"".join(out)


def down_meta_jsonl(ids: list[np.ndarray], scores: list[np.ndarray], text: Any) -> str:
    lines = []
    for layer, (ii, ss) in enumerate(zip(ids, scores, strict=True)):
        for f in range(len(ii)):
            k = [{"t": text(int(t)), "i": int(t), "s": float(s)} for t, s in zip(ii[f], ss[f], strict=True)]
            lines.append(json.dumps({"l": layer, "f": f, "t": k[0]["t"], "i": k[0]["i"], "c": k[0]["s"], "k": k}))
    return "\n".join(lines) + "\n"


def write_larql_vindex(out: Path, v: Any, dtype: str = "f32", jsonl: bool = False, reversed_magic: bool = False,
                       labels: dict[str, str] | None = None, extra: dict[str, bytes] | None = None) -> Path:
    """`v` (an opened larql vindex) written as LARQL writes a browse-level vindex, into `out`."""
    out.mkdir(parents=True)
    np_dtype = {"f32": "<f4", "f16": "<f2"}[dtype]
    n, hidden = v.num_layers, v.hidden
    gates, layers, offset = [], [], 0
    for layer in range(n):
        block = np.asarray(v.gate_vectors(layer), np.float32).astype(np_dtype).tobytes()
        layers.append({"layer": layer, "num_features": v.num_features(layer), "offset": offset, "length": len(block)})
        gates.append(block)
        offset += len(block)
    files = {"gate_vectors.bin": b"".join(gates),
             "embeddings.bin": np.asarray(v.embeddings, np.float32).astype(np_dtype).tobytes(),
             "tokenizer.json": (v.path / "tokenizer.json").read_bytes()}
    ids = [np.asarray(v.down_meta(i)[0]) for i in range(n)]
    scores = [np.asarray(v.down_meta(i)[1]) for i in range(n)]
    if jsonl:
        files["down_meta.jsonl"] = down_meta_jsonl(ids, scores, v.token_text).encode()
    else:
        files["down_meta.bin"] = down_meta_bin(ids, scores, reversed_magic)
    if labels is not None:
        files["feature_labels.json"] = json.dumps(labels).encode()
    files.update(extra or {})
    i = v.index
    mc = i["model_config"]
    index = {
        "version": 2, "model": "google/tiny-test", "family": i["family"],
        "source": {"huggingface_repo": "google/tiny-test", "huggingface_revision": "main",
                   "safetensors_sha256": "0" * 64, "extracted_at": "2026-05-01T00:00:00Z", "larql_version": "0.4.0"},
        "checksums": {name: hashlib.sha256(data).hexdigest() for name, data in files.items() if name.endswith(".bin")},
        "num_layers": n, "hidden_size": hidden, "intermediate_size": i["intermediate_size"],
        "vocab_size": i["vocab_size"], "embed_scale": i["embed_scale"], "extract_level": "browse",
        "dtype": dtype, "quant": "none", "layer_bands": i["layer_bands"], "layers": layers,
        "down_top_k": v.top_k, "has_model_weights": False,
        "model_config": {"model_type": i["family"], "head_dim": mc["head_dim"], "num_q_heads": mc["n_heads"],
                         "num_kv_heads": mc["n_kv_heads"], "rope_base": mc["rope_base"], "attention_k_eq_v": False},
    }
    for name, data in files.items():
        (out / name).write_bytes(data)
    (out / "index.json").write_text(json.dumps(index, indent=2))
    return out
