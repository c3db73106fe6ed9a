"""Model -> vindex, streaming one layer at a time (peak memory: the unembedding plus one layer).

Stages: tokenizer, embeddings, gate vectors, down_meta (each feature's top output tokens, exact),
and from the inference level the model's tensors in their stored encoding. See
vindex_spec/FORMAT.md for the bytes.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from larql.errors import VindexError
from larql.io.pathguard import overlap
from larql.model import Model
from larql.model.config import ModelConfig
from larql.model.load import load, resolve
from larql.model.weights import named_tensors
from larql.quant import BLOCK_LAYOUT, GGMLType, QuantMatrix
from larql.quant.quantize import quantize_q4_k, quantize_q6_k
from larql.version import __version__
from larql.vindex import clusters, layout, topk
from larql.vindex.integrity import sha256_path
from larql.vindex.writer import VindexWriter

Progress = Callable[[str, int, int], None]  # (stage, done, total)

VOCAB_CHUNK = topk.VOCAB_CHUNK  # unembedding rows per step


def down_top_tokens(down: QuantMatrix, unembed: np.ndarray, top_k: int,
                    tokens: topk.Tokens | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For each feature f (a column of W_down `[hidden, ffn]`), the top_k tokens t by U[t] . W_down[:, f]:
    ids and the exact scores rounded to float32, by score descending, an equal score never displacing
    a lower id. `tokens`: `topk.prepare(unembed)`, made once for every layer (made here without it).

    A bounded approximate pass (int8 on the avx512vnni and avx2 tiers, float32 otherwise) and exact rescoring of
    the few tokens it cannot rule out (larql/vindex/topk_kernels.py), so the `[ffn, vocab]` score
    matrix never exists whole.
    """
    tok = tokens if tokens is not None else topk.prepare(unembed)
    return topk.top_tokens(tok, down.dequantize().T, top_k)


# Q4_K_M-style choice: 4-bit for most matrices, 6-bit for the ones most sensitive to error.
_Q4K = ("attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight")
_Q6K = ("attn_v.weight", "ffn_down.weight")
_QUANTIZERS = {GGMLType.Q4_K: quantize_q4_k, GGMLType.Q6_K: quantize_q6_k}


def _bits(qtype: GGMLType) -> float:
    block, size = BLOCK_LAYOUT[qtype]
    return 8.0 * size / block


def q4k_target(name: str, m: QuantMatrix) -> GGMLType | None:
    """--quant q4k: the type layer matrix `name` becomes (Q4_K; Q6_K for attn_v and ffn_down), or
    None when it keeps its encoding: not a layer matrix (embeddings, norms), rows that are not a
    whole number of 256-weight K blocks (Gemma 3 270M's 640, SmolLM2's 576), or a source already
    at or below the target's bits per weight (requantizing upward adds bytes, not precision).
    A float or wider quantized source (Q8_0, Q5_0...) is dequantized and quantized again."""
    target = GGMLType.Q4_K if name.endswith(_Q4K) else GGMLType.Q6_K if name.endswith(_Q6K) else None
    if target is None or m.n_cols % 256 or _bits(m.qtype) <= _bits(target):
        return None
    return target


def requantize(name: str, m: QuantMatrix) -> QuantMatrix:
    """`m` in its --quant q4k encoding (itself when `q4k_target` says it keeps its encoding)."""
    target = q4k_target(name, m)
    return m if target is None else _QUANTIZERS[target](m.dequantize(), m.name)


def _q4k_plan(model: Model) -> dict[str, int]:
    """How many matrices --quant q4k turns into each type; refuses when it would change nothing."""
    counts = {"Q4_K": 0, "Q6_K": 0, "kept": 0}
    for name, value in named_tensors(model.weights):
        if isinstance(value, QuantMatrix):
            target = q4k_target(name, value)
            counts[target.name if target is not None else "kept"] += 1
    if counts["Q4_K"] + counts["Q6_K"] == 0:
        raise VindexError(f"--quant q4k would change nothing in {model.name}: its layer matrices are already at "
                          f"or below Q4_K/Q6_K's bits per weight, or their rows are not whole 256-weight blocks; "
                          f"use --quant source")
    return counts


# model_config fields written only when not at their default (added after version 1)
OPTIONAL_FIELDS: dict[str, Any] = {"rope_freq_factors": [], "rope_short_factors": [], "rope_long_factors": [],
                                   "rope_attn_factor": 1.0}


def model_config(cfg: ModelConfig) -> dict[str, Any]:
    """index.json's model_config: the config's fields, tuples as lists; the rope factor fields only
    when they hold something (so that a vindex without them is written as before they existed)."""
    mc = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}
    for key, default in OPTIONAL_FIELDS.items():
        if mc[key] == default:
            del mc[key]
    return mc


def extract(src: str | Path | Model, out: str | Path, level: str = "browse", dtype: str = "f16",
            quant: str = "source", top_k: int = 10, overwrite: bool = False,
            progress: Progress | None = None) -> Path:
    """Extract a vindex from a model alias, GGUF file, HF directory or loaded Model.

    Args:
        level: "browse" (embeddings, gate vectors, down_meta, tokenizer) or "inference"/"all"
            (plus every model tensor, so the vindex alone runs the model).
        dtype: "f16" or "f32" for embeddings and gate vectors.
        quant: "source" keeps model tensors in their stored encoding (GGUF blocks copied as they are);
            "q4k" quantizes float layer matrices to Q4_K / Q6_K (see `requantize`).
        top_k: output tokens kept per feature in down_meta.
    Returns:
        The vindex directory.
    """
    if level not in layout.LEVELS:
        raise VindexError(f"unknown extract level {level!r} (choose one of: {', '.join(layout.LEVELS)})")
    if dtype not in layout.DTYPES:
        raise VindexError(f"unknown dtype {dtype!r} (choose f16 or f32)")
    if quant not in ("source", "q4k"):
        raise VindexError(f"unknown quant {quant!r} (choose source or q4k)")
    if not 1 <= top_k <= 1000:
        raise VindexError(f"down top-k must be between 1 and 1000, got {top_k}")
    report = progress or (lambda stage, done, total: None)
    if quant == "q4k" and level == "browse":
        raise VindexError("--quant q4k quantizes model weights, and a browse-level vindex holds none; "
                          "add --level inference")
    model = src if isinstance(src, Model) else load(src)
    requantized = _q4k_plan(model) if quant == "q4k" else None
    source_path = model.source if isinstance(src, Model) else resolve(src)[1]
    refused = overlap(out, [(Path(source_path), "the model extracted")]) if source_path else None
    if refused is not None:
        raise VindexError(f"{refused}; extract into another directory")
    cfg, w = model.config, model.weights
    np_dtype = layout.DTYPES[dtype]
    source_sha, source_size = sha256_path(Path(source_path))

    with VindexWriter(Path(out), overwrite=overwrite) as writer:
        report("tokenizer", 0, 1)
        writer.text(layout.TOKENIZER_FILE, model.tokenizer.tok.to_str())
        report("tokenizer", 1, 1)

        unembed = w.output.dequantize()  # (vocab, hidden) float32: the one big allocation
        embed = unembed if w.output is w.token_embd else w.token_embd.dequantize()  # tied: dequantized once
        embeddings = writer.binary(layout.EMBEDDINGS_FILE)
        for start in range(0, len(embed), VOCAB_CHUNK):
            embeddings.write(embed[start:start + VOCAB_CHUNK].astype(np_dtype))
            report("embeddings", min(start + VOCAB_CHUNK, len(embed)), len(embed))

        gates = writer.binary(layout.GATE_FILE)
        down_meta = writer.binary(layout.DOWN_META_FILE)
        header = layout.DOWN_META_MAGIC + np.array([layout.DOWN_META_VERSION, cfg.n_layers, top_k], "<u4").tobytes()
        down_meta.write(header.ljust(layout.DOWN_META_HEADER, b"\0"))
        tokens = topk.prepare(unembed)  # its int8 tiles: once for every layer
        token_texts = model.tokenizer.tok.decode_batch([[i] for i in range(w.token_embd.n_rows)],
                                                       skip_special_tokens=False)
        words = clusters.whole_words(token_texts)
        word_emb = clusters.word_rows(embed, words) if len(words) else None
        band = layout.layer_bands(cfg.n_layers)["knowledge"]
        dirs: list[np.ndarray] = []
        members: list[tuple[int, int]] = []
        outputs: list[str] = []
        layers = []
        for i, lw in enumerate(w.layers):
            # a mixture of experts: one block holding every expert's rows, expert 0's first
            ffns = [(lw.gate, lw.down)] if lw.gate is not None and lw.down is not None else \
                [(gate_m, down_m) for gate_m, _, down_m in lw.experts]
            parts = [g.dequantize() for g, _ in ffns]
            gate = (parts[0] if len(parts) == 1 else np.concatenate(parts)).astype(np_dtype)  # (experts x ffn, hidden)
            gate_offset = gates.write_aligned(gate)
            tops = [down_top_tokens(d, unembed, top_k, tokens) for _, d in ffns]
            ids, vals = np.concatenate([t[0] for t in tops]), np.concatenate([t[1] for t in tops])
            dm_offset = down_meta.write_aligned(ids)
            down_meta.write(vals)
            layers.append({"layer": i, "num_features": int(gate.shape[0]), "gate_offset": gate_offset,
                           "gate_length": int(gate.nbytes), "down_meta_offset": dm_offset,
                           "down_meta_length": int(ids.nbytes + vals.nbytes),
                           **({"num_experts": len(lw.experts)} if lw.experts else {})})
            if band[0] <= i <= band[1] and word_emb is not None:
                d, m, o = clusters.layer_directions(embed, token_texts, words, word_emb, i, gate.astype(np.float32),
                                                    ids[:, 0])
                dirs.append(d)
                members += m
                outputs += o
            report("gate vectors + down_meta", i + 1, cfg.n_layers)
        del unembed, embed, tokens, word_emb

        report("relation clusters", 0, 1)
        found = clusters.cluster_directions(np.concatenate(dirs) if dirs else np.zeros((0, cfg.hidden), np.float16),
                                            members, outputs)
        if found is not None:
            writer.text(layout.CLUSTERS_FILE, json.dumps(found.to_json()))
            writer.text(layout.FEATURE_CLUSTERS_FILE,
                        "".join(json.dumps({"l": l, "f": f, "c": c}) + "\n" for l, f, c in found.members))
        report("relation clusters", 1, 1)

        if level != "browse":
            manifest = []
            blob = writer.binary(layout.WEIGHTS_FILE)
            tensors = list(named_tensors(w))
            for n, (name, value) in enumerate(tensors):
                if quant == "q4k" and isinstance(value, QuantMatrix):
                    value = requantize(name, value)
                if isinstance(value, QuantMatrix):
                    offset = blob.write_aligned(value.raw)
                    entry = {"type": value.qtype.name, "shape": [value.n_rows, value.n_cols], "nbytes": value.nbytes}
                else:
                    vec = np.ascontiguousarray(value, dtype=np.float32)
                    offset = blob.write_aligned(vec)
                    entry = {"type": GGMLType.F32.name, "shape": [int(vec.size)], "nbytes": int(vec.nbytes)}
                manifest.append({"name": name, **entry, "offset": offset})
                report("model weights", n + 1, len(tensors))
            writer.text(layout.MANIFEST_FILE, json.dumps(manifest, indent=0))

        index = {
            "format": layout.FORMAT_NAME, "version": layout.FORMAT_VERSION, "larql_version": __version__,
            "model": model.name, "family": cfg.arch,
            "source": {"path": str(Path(source_path).resolve()), "sha256": source_sha, "size": source_size,
                       "extracted_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")},
            "extract_level": level, "dtype": dtype, "quant": "none" if level == "browse" else quant,
            "num_layers": cfg.n_layers, "hidden_size": cfg.hidden, "intermediate_size": cfg.ffn,
            "vocab_size": w.token_embd.n_rows, "embed_scale": cfg.embed_scale, "down_top_k": top_k,
            "has_model_weights": level != "browse", "layer_bands": layout.layer_bands(cfg.n_layers),
            "layers": layers, "model_config": model_config(cfg),
            "tokenizer": {"bos_id": model.tokenizer.bos_id, "eos_ids": list(model.tokenizer.eos_ids)},
        }
        if requantized is not None:
            index["requantized"] = requantized
        return writer.finish(index)
