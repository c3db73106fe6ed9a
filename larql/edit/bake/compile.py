"""COMPILE: bake an editable vindex's patch overlay into a new standalone vindex, or into a GGUF model file.

The new vindex runs, dense, as the base ran with its overlay (no patch needed): for every layer
with vector edits or deletions its ffn_gate / ffn_up / ffn_down are written as float32 with the
edited rows (gate, up) and columns (down) replaced and deleted features zeroed, so no
requantization error creeps in; every other tensor keeps its stored bytes. gate_vectors.bin and
down_meta.bin carry the edits too. Written atomically, like an extraction; the base is not touched.

Features METHOD NEURON added to a layer make every layer wider, in every output format: one FFN
width for all layers, since the vindex format, GGUF's feed_forward_length and HF's
intermediate_size each hold one (edit/bake/widen.py says how wide, and why the new slots are no-ops).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from larql.edit.bake.widen import ffn_width, gate_rows, widened, widened_shape, zero_rows
from larql.edit.patches.overlay import FeatureOverride
from larql.edit.state.view import EditableVindex
from larql.errors import VindexError
from larql.io.pathguard import overlap, vindex_reads
from larql.io.tempfiles import clean_stale, publish, temp_path
from larql.model.gguf_fuse import OutTensor, fuse
from larql.model.gguf_meta import gguf_arch, vindex_fields, write_fields
from larql.quant import GGMLType, QuantMatrix
from larql.vindex import layout
from larql.vindex.weights import VindexWeightSource
from larql.vindex.writer import VindexWriter

CONFLICT_RULES = ("last_wins", "highest_confidence", "fail")


@dataclass(frozen=True)
class CompileReport:
    path: Path
    edited_features: int
    layers_rewritten: tuple[int, ...]
    conflicts: tuple[tuple[int, int], ...]  # slots written by more than one patch
    size_bytes: int
    ffn_width: int  # every layer's FFN width as written (wider than the base's when features were added)


def conflicts(v: EditableVindex) -> list[tuple[int, int]]:
    """(layer, feature) slots that more than one applied patch (or the unsaved edits) write."""
    owners: dict[tuple[int, int], set[int]] = {}
    groups = [p.ops for p in v.patches.applied] + [v.patches.pending]
    for g, ops in enumerate(groups):
        for op in ops:
            if op.feature >= 0:  # weight edits add up; they write no slot
                owners.setdefault((op.layer, op.feature), set()).add(g)
    return sorted(k for k, gs in owners.items() if len(gs) > 1)


def _check_conflicts(v: EditableVindex, on_conflict: str) -> list[tuple[int, int]]:
    if on_conflict not in CONFLICT_RULES:
        raise VindexError(f"ON CONFLICT must be one of {', '.join(CONFLICT_RULES)}, got {on_conflict!r}")
    clashes = conflicts(v)
    if clashes and on_conflict == "fail":
        shown = ", ".join(f"L{l} F{f}" for l, f in clashes[:5])
        raise VindexError(f"{len(clashes)} feature(s) are written by more than one patch ({shown}); "
                          f"ON CONFLICT LAST_WINS keeps the latest")
    return clashes


# layer -> (vector overrides, deleted features, the weight edits' (U, V) or None)
Edited = dict[int, tuple[dict[int, FeatureOverride], set[int], "tuple[np.ndarray, np.ndarray] | None"]]


def edited_layers(v: EditableVindex) -> Edited:
    out = {}
    for layer in range(v.num_layers):
        vectors, gone, delta = v.overlay.layer(layer), v.overlay.deleted(layer), v.overlay.down_delta(layer)
        if vectors or gone or delta is not None:
            out[layer] = (vectors, gone, delta)
    return out


def _rewritten(v: EditableVindex, edited: Edited) -> tuple[int, ...]:
    """Layers whose FFN weights carry edits: edited in place or given added features."""
    return tuple(sorted(set(edited) | set(v.overlay.added_layers())))


def _output(v: EditableVindex, out: str | Path) -> Path:
    """`out`, refused when it is, is inside or holds the vindex compiled or its source model."""
    refused = overlap(out, vindex_reads(v.path, v.index, "the vindex compiled"))
    if refused is not None:
        raise VindexError(f"{refused} (base vindexes are read-only; write the output somewhere else)")
    return Path(out)


def compile_vindex(v: EditableVindex, out: str | Path, on_conflict: str = "last_wins", overwrite: bool = False) -> CompileReport:
    clashes = _check_conflicts(v, on_conflict)
    out = _output(v, out)
    edited = edited_layers(v)
    width = ffn_width(v.overlay, v.index)
    with VindexWriter(out, overwrite=overwrite) as w:
        for name in v.index["files"]:
            if name not in (layout.GATE_FILE, layout.DOWN_META_FILE, layout.WEIGHTS_FILE, layout.MANIFEST_FILE):
                w.copy(name, v.path / name)
        layers = _write_gates_and_meta(v, w, edited, width)
        if v.has_model_weights:
            _write_weights(v, w, edited, width)
        index = {**v.index, "layers": layers, "intermediate_size": width,
                 "model_config": {**v.index["model_config"], "ffn": width},
                 "compiled_from": {"path": str(v.path.resolve()), "patches": [p.name for p in v.patches.applied],
                                   "unsaved_edits": len(v.patches.pending), "edited_features": len(v.overlay),
                                   "compiled_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}}
        index.pop("files", None)
        path = w.finish(index)
    size = sum(f.stat().st_size for f in path.iterdir())
    return CompileReport(path, len(v.overlay), _rewritten(v, edited), tuple(clashes), size, width)


def _write_gates_and_meta(v: EditableVindex, w: VindexWriter, edited: Edited, width: int) -> list[dict[str, Any]]:
    gates, meta = w.binary(layout.GATE_FILE), w.binary(layout.DOWN_META_FILE)
    header = layout.DOWN_META_MAGIC + np.array([layout.DOWN_META_VERSION, v.num_layers, v.store.top_k], "<u4").tobytes()
    meta.write(header.ljust(layout.DOWN_META_HEADER, b"\0"))
    layers = []
    for layer in range(v.num_layers):
        gate = v.gate_vectors(layer)
        if layer in edited:
            vectors, gone, _ = edited[layer]
            gate = np.array(gate)
            for f, ov in vectors.items():
                if ov.gate is not None:
                    gate[f] = ov.gate.astype(gate.dtype)
            for f in gone:
                gate[f] = 0
        ids, scores = v.down_meta(layer)  # the overlay's view: edited and deleted rows applied
        if not v.num_experts(layer):  # added features' rows at their ids, zero features up to the width
            gate = gate_rows(gate, v.overlay, layer, width)
            ids, scores = zero_rows(ids, width), zero_rows(scores, width)
        gate_offset = gates.write_aligned(np.ascontiguousarray(gate))
        dm_offset = meta.write_aligned(np.ascontiguousarray(ids, dtype="<u4"))
        meta.write(np.ascontiguousarray(scores, dtype="<f4"))
        layers.append({"layer": layer, "num_features": int(gate.shape[0]), "gate_offset": gate_offset,
                       "gate_length": int(gate.nbytes), "down_meta_offset": dm_offset,
                       "down_meta_length": int(ids.size * 8),
                       **({"num_experts": v.num_experts(layer)} if v.num_experts(layer) else {})})
    return layers


def edited_matrix(source: Any, name: str, edited: Edited) -> np.ndarray | None:
    """The float32 matrix of an edited layer's ffn_gate / ffn_up / ffn_down with the overlay's rows
    (gate, up) or columns (down) put in and deleted features' down columns zeroed; else None."""
    parts = name.split(".")
    layer = int(parts[1]) if parts[0] == "blk" else -1
    kind = parts[2] if layer >= 0 else ""
    if layer not in edited or kind not in ("ffn_gate", "ffn_up", "ffn_down") or parts[-1] != "weight":
        return None  # a bias (GPT-2's) holds no feature's vector: ffn_down.bias is per hidden unit, not per feature
    vectors, gone, delta = edited[layer]
    field = {"ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down"}[kind]
    if not vectors and not gone and field != "down":
        return None  # a layer with weight edits only: its gate and up keep their stored blocks
    m = source.matrix(name).dequantize()  # float32: gate/up (ffn, hidden), down (hidden, ffn)
    n = m.shape[1] if field == "down" else m.shape[0]
    # expert e's tensors (blk.L.ffn_gate.e.weight) hold the layer's features e x ffn .. (e + 1) x ffn - 1
    first = int(parts[3]) * n if len(parts) == 5 else 0
    for f, ov in vectors.items():
        vec = getattr(ov, field)
        if vec is not None and 0 <= f - first < n:
            if field == "down":
                m[:, f - first] = vec
            else:
                m[f - first] = vec
    if field == "down":
        if delta is not None:
            m += delta[0] @ delta[1].T  # ROME / MEMIT weight edits: W_down + U V^T
        for f in gone:  # after the delta: the FFN zeroes a deleted feature's activation, so its delta column is unused too
            if 0 <= f - first < n:
                m[:, f - first] = 0.0
    return np.ascontiguousarray(m, dtype=np.float32)


def _write_weights(v: EditableVindex, w: VindexWriter, edited: Edited, width: int) -> None:
    source = VindexWeightSource(v.path)
    manifest = json.loads((v.path / layout.MANIFEST_FILE).read_text())
    blob = w.binary(layout.WEIGHTS_FILE)
    out = []
    for e in manifest:
        m = widened(source, e["name"], edited_matrix(source, e["name"], edited), v.overlay, width)
        if isinstance(m, QuantMatrix):  # stored blocks, zero-padded to the width
            offset = blob.write_aligned(m.raw)
            out.append({"name": e["name"], "type": m.qtype.name, "shape": [m.n_rows, m.n_cols],
                        "nbytes": m.nbytes, "offset": offset})
        elif m is not None:
            offset = blob.write_aligned(m)
            out.append({"name": e["name"], "type": GGMLType.F32.name, "shape": [int(d) for d in m.shape],
                        "nbytes": int(m.nbytes), "offset": offset})
        else:
            offset = blob.write_aligned(np.ascontiguousarray(source.matrix(e["name"]).raw))
            out.append({**e, "offset": offset})
    w.text(layout.MANIFEST_FILE, json.dumps(out, indent=0))


def interleave_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """q/k rows from rotate-half order to llama.cpp's adjacent pairs (its converter's permute)."""
    rows, cols = w.shape
    return np.ascontiguousarray(w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols),
                                dtype=np.float32)


def compile_gguf(v: EditableVindex, out: str | Path, on_conflict: str = "last_wins", overwrite: bool = False) -> CompileReport:
    """COMPILE ... INTO MODEL "x.gguf" FORMAT GGUF: the vindex's weights with its overlay baked in
    (edited FFN tensors as F32, the rest in their stored blocks, zero-padded when features were
    added: widen.py), under the metadata (architecture, hyperparameters, tokenizer) of the GGUF it
    was extracted from when that file is still there, else metadata rebuilt from the vindex
    (model/gguf_meta.py); llama.cpp runs the result."""
    import gguf

    if not v.has_model_weights:
        raise VindexError(f"{v.path}: a browse-level vindex has no weights to compile into a model")
    clashes = _check_conflicts(v, on_conflict)
    src = Path(v.index["source"]["path"])
    # the source GGUF's metadata, copied whole, when it is still there; else rebuilt from the vindex
    has_source = src.suffix == ".gguf" and src.is_file() and src.stat().st_size == v.index["source"]["size"]
    out = _output(v, out)
    clean_stale(out)  # what a killed writer of this file left (a complete old one comes back)
    if out.exists() and not overwrite:
        raise VindexError(f"{out}: already exists; choose another path (or replace it: FORCE in LQL)")
    width = ffn_width(v.overlay, v.index)
    cfg = {**v.index["model_config"], "ffn": width}
    fields = None if has_source else vindex_fields({**v.index, "model_config": cfg},
                                                   (v.path / "tokenizer.json").read_text())
    # llama.cpp's llama rotates adjacent q/k pairs; a vindex from an HF checkpoint keeps rotate-half rows
    permute = gguf_arch(cfg) == "llama" and not cfg["rope_interleaved"]
    edited = edited_layers(v)
    source = VindexWeightSource(v.path)
    manifest = json.loads((v.path / layout.MANIFEST_FILE).read_text())
    tmp = temp_path(out)
    try:
        if fields is None:
            reader = gguf.GGUFReader(src)
            arch = str(reader.fields["general.architecture"].contents())
            writer = gguf.GGUFWriter(tmp, arch)
            for field in reader.fields.values():
                if field.name.startswith("GGUF.") or field.name == "general.architecture":
                    continue
                vtype = field.types[0]
                sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
                value = field.contents()
                if field.name == f"{arch}.feed_forward_length":  # the width added features made (widen.py)
                    value = [width] * len(value) if isinstance(value, list) else width
                writer.add_key_value(field.name, value, vtype, sub)
        else:
            writer = gguf.GGUFWriter(tmp, gguf_arch(cfg))
            write_fields(writer, fields)
        factors = cfg.get("rope_freq_factors")
        if factors:  # Llama 3.1's rope scaling, which llama.cpp reads from this tensor
            writer.add_tensor("rope_freqs.weight", np.asarray(factors, dtype=np.float32))
        if cfg.get("rope_scaling") == "longrope":  # Phi-3's, which llama.cpp reads from these two tensors
            for kind in ("short", "long"):
                writer.add_tensor(f"rope_factors_{kind}.weight", np.asarray(cfg[f"rope_{kind}_factors"], np.float32))
        tensors = []
        for e in manifest:
            m = widened(source, e["name"], edited_matrix(source, e["name"], edited), v.overlay, width)
            if permute and e["name"].endswith((".attn_q.weight", ".attn_k.weight")):
                heads = cfg["n_heads"] if e["name"].endswith("q.weight") else cfg["n_kv_heads"]
                m = interleave_rope_rows(m if isinstance(m, np.ndarray) else source.matrix(e["name"]).dequantize(),
                                         heads)
            if m is not None:
                tensors.append(OutTensor(e["name"], m))
            else:
                q = source.matrix(e["name"])
                tensors.append(OutTensor(e["name"], q.dequantize().reshape(e["shape"]) if q.qtype == GGMLType.F32
                                         else q))
        for t in fuse(gguf_arch(cfg), tensors):  # Phi-3's and GPT-2's fused tensors, as llama.cpp names them
            if isinstance(t.data, np.ndarray):
                writer.add_tensor(t.name, np.ascontiguousarray(t.data, dtype=np.float32))
            else:
                writer.add_tensor(t.name, np.ascontiguousarray(t.data.raw),
                                  raw_dtype=gguf.GGMLQuantizationType(int(t.data.qtype)))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        publish(tmp, out, overwrite)
    except FileExistsError:
        raise VindexError(f"{out}: already exists; choose another path (or replace it: FORCE in LQL)") from None
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise VindexError(f"{out}: cannot write the GGUF ({e.strerror or e})") from e
    finally:
        tmp.unlink(missing_ok=True)
    return CompileReport(out, len(v.overlay), _rewritten(v, edited), tuple(clashes), out.stat().st_size, width)


def compile_safetensors(v: EditableVindex, out: str | Path, on_conflict: str = "last_wins", overwrite: bool = False,
                        dtype: str = "bf16") -> CompileReport:
    """COMPILE ... INTO MODEL "dir" FORMAT SAFETENSORS: a Hugging Face directory (config.json,
    model.safetensors, tokenizer files) holding the vindex's weights with its overlay baked in,
    dequantized to `dtype`. Needs no source file: index.json and the vindex's tokenizer suffice."""
    from larql.model.export_hf import (
        ExportTensor,
        TokenizerFiles,
        source_chat_template,
        write_hf_dir,
    )
    from larql.vindex.runtime import index_config

    if not v.has_model_weights:
        raise VindexError(f"{v.path}: a browse-level vindex has no weights to compile into a model")
    out = _output(v, out)
    clashes = _check_conflicts(v, on_conflict)
    width = ffn_width(v.overlay, v.index)
    cfg = dataclasses.replace(index_config(v.store), ffn=width)
    edited = edited_layers(v)
    source = VindexWeightSource(v.path)

    def load(name: str, is_vector: bool) -> np.ndarray:
        m = widened(source, name, None if is_vector else edited_matrix(source, name, edited), v.overlay, width)
        if isinstance(m, QuantMatrix):
            return m.dequantize()
        if m is not None:
            return m
        return source.vector(name) if is_vector else source.matrix(name).dequantize()

    manifest = json.loads((v.path / layout.MANIFEST_FILE).read_text())
    tensors = [ExportTensor(e["name"], widened_shape(e["name"], e["shape"], width),
                            functools.partial(load, e["name"], len(e["shape"]) == 1)) for e in manifest]
    tok = v.store.tokenizer
    files = TokenizerFiles((v.path / layout.TOKENIZER_FILE).read_text(), tok.bos_id, tuple(tok.eos_ids),
                           source_chat_template(Path(v.index["source"]["path"])))
    path = write_hf_dir(out, cfg, tensors, files, dtype, overwrite)
    size = sum(f.stat().st_size for f in path.iterdir())
    return CompileReport(path, len(v.overlay), _rewritten(v, edited), tuple(clashes), size, width)
