"""`larql convert`: between the forms a model takes. A model (alias, GGUF file, HF directory) becomes
a vindex or an HF directory; a vindex (with any patches applied) becomes a GGUF file or an HF
directory; a vindex LARQL wrote (index.json version 2) becomes a larql vindex at the browse level.
Each direction is one existing writer, all atomic: extract, compile_gguf, compile_safetensors,
export_model, convert_larql."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from larql.errors import LarqlError
from larql.io.pathguard import overlap
from larql.vindex import layout

TARGETS = ("vindex", "gguf", "safetensors")
Progress = Callable[[str, int, int], None]


def is_vindex(path: str | Path) -> bool:
    return (Path(path) / layout.INDEX_FILE).is_file()


def target_format(src: str | Path, out: str | Path, to: str | None) -> str:
    """`to` if given, else from the source and the output name: a vindex becomes GGUF when `out`
    ends in .gguf and an HF directory otherwise; a model becomes a vindex."""
    if to is not None and to not in TARGETS:
        raise LarqlError(f"--to {to!r}: choose one of {', '.join(TARGETS)}")
    from_vindex, suffix = is_vindex(src), Path(out).suffix.lower()
    if from_vindex:
        fmt = to or {".gguf": "gguf", ".vindex": "vindex"}.get(suffix, "safetensors")
    else:
        fmt = to or {".gguf": "gguf"}.get(suffix, "vindex")
    if from_vindex and fmt == "vindex":
        raise LarqlError(f"{src} is a vindex already: `larql slice` copies parts of it, "
                         f"COMPILE ... INTO VINDEX bakes patches into a new one")
    if not from_vindex and fmt == "gguf":
        raise LarqlError(f"{src}: convert writes GGUF from a vindex; extract one first "
                         f"(larql convert {src} x.vindex), then larql convert x.vindex {out}")
    return fmt


def convert_from_larql(src: str | Path, out: str | Path, to: str | None, dtype: str | None, level: str | None,
                       quant: str, patches: Sequence[str | Path], overwrite: bool,
                       progress: Progress | None) -> tuple[str, Path]:
    """A LARQL vindex into a larql vindex (browse level); any other output is refused by name."""
    from larql.vindex.larql_import import convert_larql

    to = to or ("gguf" if Path(out).suffix.lower() == ".gguf" else "vindex")
    if to != "vindex":
        raise LarqlError(f"{src} is a LARQL vindex: convert it to a larql vindex first (larql convert {src} "
                         f"OUT.vindex); at the browse level it holds no model to write as {to}")
    if patches:
        raise LarqlError(f"{src} is a LARQL vindex: convert it first (larql convert {src} OUT.vindex), then apply "
                         f"patches to OUT.vindex")
    if quant != "source":
        raise LarqlError(f"--quant {quant}: a LARQL vindex converts at the browse level, which holds no weights")
    if dtype not in (None, *layout.DTYPES):
        raise LarqlError(f"--dtype {dtype}: a vindex's embeddings and gates are f16 or f32")
    return "vindex", convert_larql(src, out, dtype=dtype, level=level, overwrite=overwrite, progress=progress)


def convert(src: str | Path, out: str | Path, to: str | None = None, dtype: str | None = None,
            level: str | None = None, quant: str = "source", patches: Sequence[str | Path] = (),
            overwrite: bool = False, progress: Progress | None = None) -> tuple[str, Path]:
    """Convert `src` into `out`; returns (the format written, its path).

    Args:
        to: "vindex", "gguf" or "safetensors" (default: see `target_format`).
        dtype: vindex: f16 (default) or f32 for embeddings and gates; safetensors: bf16 (default),
            f16 or f32; GGUF keeps every tensor's stored encoding, so no dtype applies.
        level, quant: for a vindex target, as `larql extract` (level inference by default).
        patches: .vlp files applied to a vindex source before it is written.

    A LARQL vindex source (its index.json version 2) becomes a larql vindex at the browse level
    (larql/vindex/larql_import.py); one holding the model's weights only with level "browse",
    which says they are left behind.

    Example:
        >>> convert("gemma3-270m", "g.vindex"); convert("g.vindex", "g-hf", patches=["facts.vlp"])
    """
    from larql.vindex.larql_import import is_larql_vindex

    if is_larql_vindex(src):
        return convert_from_larql(src, out, to, dtype, level, quant, patches, overwrite, progress)
    level = level or "inference"
    fmt = target_format(src, out, to)
    reads = [(Path(x), w) for x, w in ((src, "the source converted"), *((q, "a patch it applies") for q in patches))
             if Path(x).exists()]
    refused = overlap(out, reads)
    if refused is not None:
        raise LarqlError(f"{refused}; write the output somewhere else")
    if patches and not is_vindex(src):
        raise LarqlError(f"--patch applies to a vindex source, and {src} is a model; convert it to a vindex first")
    if fmt == "gguf" and dtype is not None:
        raise LarqlError("--dtype does not apply to GGUF output: every tensor keeps its stored encoding")
    if fmt == "vindex":
        from larql.vindex.extract import extract

        return fmt, extract(src, out, level=level, dtype=dtype or "f16", quant=quant, overwrite=overwrite,
                            progress=progress)
    if not is_vindex(src):
        from larql.model.export_hf import export_model
        from larql.model.load import load

        return fmt, export_model(load(src), out, dtype=dtype or "bf16", overwrite=overwrite)
    from larql.edit.bake.compile import compile_gguf, compile_safetensors
    from larql.edit.state.view import edit_vindex

    v = edit_vindex(src)
    for p in patches:
        v.patches.apply(p)
    if fmt == "gguf":
        return fmt, compile_gguf(v, out, overwrite=overwrite).path
    return fmt, compile_safetensors(v, out, overwrite=overwrite, dtype=dtype or "bf16").path
