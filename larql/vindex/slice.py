"""`larql slice`: a new vindex holding some parts of another, for a deployment that needs only them.

Every slice keeps the browse core (tokenizer, embeddings, gates, down_meta: opening and browsing
a vindex read them); the optional parts are relation clusters and feature labels (up to three files) and two groups of model
tensors in weights.bin (attention: everything but the FFN matrices, norms included, since the
client runs the residual stream; ffn: ffn_gate / ffn_up / ffn_down). Whole files are hard-linked
when the file system allows (the base is never written, and every writer makes new files, so a
shared inode is safe) and their checksums carried over, so `verify` still checks them; a weights
subset is rewritten with only its tensors. index.json records `parts` and `sliced_from`. Only a
slice with both attention and ffn runs the model (`has_model_weights`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from larql.errors import VindexError
from larql.io.pathguard import overlap, vindex_reads
from larql.vindex import layout

if TYPE_CHECKING:  # PARTS and PRESETS are read by `larql --help`, which loads no numpy
    from larql.vindex.store import Vindex

FILE_PARTS: dict[str, tuple[str, ...]] = {
    "tokenizer": (layout.TOKENIZER_FILE,), "embeddings": (layout.EMBEDDINGS_FILE,), "gates": (layout.GATE_FILE,),
    "down_meta": (layout.DOWN_META_FILE,), "clusters": (layout.CLUSTERS_FILE, layout.FEATURE_CLUSTERS_FILE, layout.FEATURE_LABELS_FILE),
}
TENSOR_PARTS = ("attention", "ffn")
PARTS = (*FILE_PARTS, *TENSOR_PARTS)
REQUIRED = ("tokenizer", "embeddings", "gates", "down_meta")  # every vindex has them (FORMAT.md): browsing reads them
PRESETS: dict[str, tuple[str, ...]] = {
    "browse": (*REQUIRED, "clusters"),
    "inference": PARTS,
    "client": (*REQUIRED, "clusters", "attention"),  # attention runs here; the FFN is someone else's
    "server": (*REQUIRED, "ffn"),  # the FFN half: its features and their weights
}
PULL_SLICES = ("all", *PRESETS)  # what `larql pull --slice` takes; all: the whole repository, as it is
_FFN = (".ffn_gate.", ".ffn_up.", ".ffn_down.")


@dataclass(frozen=True)
class SlicePart:
    name: str
    items: tuple[str, ...]  # file names, or tensor names for attention / ffn
    size: int  # bytes


def parse_parts(preset: str | None, parts: str | None) -> tuple[str, ...]:
    """The parts a --preset or a --parts list names (exactly one of them)."""
    if (preset is None) == (parts is None):
        raise VindexError("give --preset or --parts (one of them)")
    if preset is not None:
        if preset not in PRESETS:
            raise VindexError(f"unknown preset {preset!r} (choose one of: {', '.join(PRESETS)})")
        return PRESETS[preset]
    assert parts is not None
    chosen = tuple(dict.fromkeys(p.strip() for p in parts.split(",") if p.strip()))
    unknown = [p for p in chosen if p not in PARTS]
    if unknown:
        raise VindexError(f"unknown part {unknown[0]!r} (parts: {', '.join(PARTS)})")
    missing = [p for p in REQUIRED if p not in chosen]
    if missing:
        raise VindexError(f"--parts must include {', '.join(missing)}: every vindex keeps "
                          f"{', '.join(REQUIRED)} (the browse core; add clusters, attention, ffn as needed)")
    return chosen


def _tensor_part(name: str) -> str:
    return "ffn" if any(k in name for k in _FFN) else "attention"


def plan_slice(v: Vindex, parts: tuple[str, ...]) -> list[SlicePart]:
    """What each part holds in `v` and its size; a part the vindex lacks is an error."""
    files = v.index["files"]
    manifest: list[dict[str, Any]] = []
    if v.has_model_weights or layout.MANIFEST_FILE in files:
        manifest = json.loads((v.path / layout.MANIFEST_FILE).read_text())
    out = []
    for part in parts:
        if part in FILE_PARTS:
            names = tuple(n for n in FILE_PARTS[part] if n in files)
            if not names and part != "clusters":  # clusters are optional even in a full extraction
                raise VindexError(f"{v.path}: has no {part} ({', '.join(FILE_PARTS[part])}) to slice")
            out.append(SlicePart(part, names, sum(files[n]["size"] for n in names)))
        else:
            tensors = [e for e in manifest if _tensor_part(e["name"]) == part]
            if not tensors:
                raise VindexError(f"{v.path}: has no {part} tensors (extract it with --level inference)")
            size = sum(layout.align(e["nbytes"]) for e in tensors)
            out.append(SlicePart(part, tuple(e["name"] for e in tensors), size))
    return out


def slice_vindex(src: str | Path, out: str | Path, preset: str | None = None, parts: str | None = None,
                 overwrite: bool = False, source: str | None = None) -> Path:
    """Write the parts of `src` that a preset or part list names into a new vindex `out` (atomic);
    `sliced_from` names `source` (default: `src`'s absolute path).

    Example:
        >>> slice_vindex("g.vindex", "g-browse.vindex", preset="browse")
    """
    import numpy as np

    from larql.vindex.store import open_vindex
    from larql.vindex.weights import VindexWeightSource
    from larql.vindex.writer import VindexWriter

    v = open_vindex(src)
    chosen = parse_parts(preset, parts)
    refused = overlap(out, vindex_reads(v.path, v.index, "the vindex being sliced"))
    if refused is not None:
        raise VindexError(f"{refused} (base vindexes are read-only; slice into another directory)")
    planned = plan_slice(v, chosen)
    tensor_names = {n for p in planned if p.name in TENSOR_PARTS for n in p.items}
    with VindexWriter(Path(out), overwrite=overwrite) as w:
        for p in planned:
            for name in p.items if p.name in FILE_PARTS else ():
                w.link(name, v.path / name, v.index["files"][name])
        whole = v.has_model_weights and {"attention", "ffn"} <= set(chosen)
        if whole:
            for name in layout.INFERENCE_FILES:
                w.link(name, v.path / name, v.index["files"][name])
        elif tensor_names:
            weight_source = VindexWeightSource(v.path)
            manifest = [e for e in json.loads((v.path / layout.MANIFEST_FILE).read_text()) if e["name"] in tensor_names]
            blob = w.binary(layout.WEIGHTS_FILE)
            for e in manifest:
                e["offset"] = blob.write_aligned(np.ascontiguousarray(weight_source.matrix(e["name"]).raw))
            w.text(layout.MANIFEST_FILE, json.dumps(manifest, indent=0))
        return w.finish(sliced_index(v.index, chosen, preset, source or str(v.path.resolve()), whole=bool(whole),
                                     tensors=bool(tensor_names)))


def sliced_index(index: dict[str, Any], parts: tuple[str, ...], preset: str | None, source: str, *,
                 whole: bool, tensors: bool) -> dict[str, Any]:
    """A slice's index.json fields (the writer adds the file table and the seal): the source's,
    with the parts it holds, where it was cut from, and the level and quant that are left."""
    out = {k: val for k, val in index.items() if k != "files"}
    out.update({"has_model_weights": whole, "parts": list(parts),
                "extract_level": index["extract_level"] if whole else "browse",
                "quant": index["quant"] if tensors else "none",
                "sliced_from": {"path": source, "preset": preset}})
    return out


def file_parts(parts: tuple[str, ...]) -> bool:
    """Whether every part is whole files (no tensors cut out of weights.bin)."""
    return all(p in FILE_PARTS for p in parts)


def slice_files(src: Path, index: dict[str, Any], out: str | Path, parts: tuple[str, ...], preset: str | None,
                source: str, overwrite: bool = False) -> Path:
    """A slice of whole files (`file_parts`) from a directory holding only those files and the
    source's index.json (`index`, checked by schema and seal): a pulled slice, whose other files
    were never downloaded. Each file is checked against its sha256 before it goes in (atomic)."""
    from larql.vindex.check import validate_index
    from larql.vindex.integrity import check_seal, file_sha256
    from larql.vindex.writer import VindexWriter

    if not file_parts(parts):
        raise VindexError(f"{src}: the parts {', '.join(p for p in parts if p not in FILE_PARTS)} are tensors "
                          f"inside {layout.WEIGHTS_FILE}; slice the whole vindex instead")
    validate_index(index, str(src / layout.INDEX_FILE))
    check_seal(index, src)
    files = index["files"]
    with VindexWriter(Path(out), overwrite=overwrite) as w:
        for part in parts:
            names = [n for n in FILE_PARTS[part] if n in files]
            if not names and part != "clusters":
                raise VindexError(f"{src}: has no {part} ({', '.join(FILE_PARTS[part])}) to slice")
            for name in names:
                f = src / name
                if not f.is_file():
                    raise VindexError(f"{f}: missing; the slice needs it")
                if file_sha256(f) != files[name]["sha256"]:
                    raise VindexError(f"{f}: contents differ from the sha256 in {layout.INDEX_FILE} (damaged "
                                      f"or changed); fetch it again")
                w.link(name, f, files[name])
        return w.finish(sliced_index(index, parts, preset, source, whole=False, tensors=False))
