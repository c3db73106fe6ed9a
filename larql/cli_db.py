"""The database commands of the CLI, thin shells over larql.edit.convert and larql.vindex.slice:

    larql convert SRC OUT [--to vindex|gguf|safetensors] [--dtype D] [--patch P.vlp]... [--force]
    larql slice VINDEX OUT (--preset browse|inference|client|server | --parts a,b,c) [--dry-run] [--force]
"""

from __future__ import annotations

import argparse


def _size(path: object) -> float:
    from pathlib import Path

    p = Path(str(path))
    return (sum(f.stat().st_size for f in p.iterdir()) if p.is_dir() else p.stat().st_size) / 1e6


def cmd_convert(args: argparse.Namespace) -> int:
    from larql.cli import run_with_progress
    from larql.edit.convert import convert

    (fmt, path), console, seconds = run_with_progress(args, lambda report: convert(
        args.src, args.output, to=args.to, dtype=args.dtype, level=args.level, quant=args.quant,
        patches=args.patch or (), overwrite=args.force, progress=report))
    console.print(f"wrote {path} ({fmt}, {_size(path):.1f} MB) in {seconds:.1f}s")
    return 0


def cmd_slice(args: argparse.Namespace) -> int:
    from larql.vindex.slice import parse_parts, plan_slice, slice_vindex
    from larql.vindex.store import open_vindex

    if args.dry_run:
        v = open_vindex(args.vindex)
        planned = plan_slice(v, parse_parts(args.preset, args.parts))
        for p in planned:
            kind = "tensors" if p.name in ("attention", "ffn") else "files"
            shown = ", ".join(p.items[:4]) + (f", +{len(p.items) - 4} more" if len(p.items) > 4 else "")
            print(f"{p.name:<11} {p.size / 1e6:>10.1f} MB  {len(p.items)} {kind}: {shown or '(none)'}")
        total, full = sum(p.size for p in planned), sum(e["size"] for e in v.index["files"].values())
        print(f"{'total':<11} {total / 1e6:>10.1f} MB  of {full / 1e6:.1f} MB in {args.vindex}; "
              f"{args.output} not written (--dry-run)")
        return 0
    path = slice_vindex(args.vindex, args.output, preset=args.preset, parts=args.parts, overwrite=args.force)
    print(f"wrote {path} ({_size(path):.1f} MB)")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    from larql.edit.convert import TARGETS
    from larql.vindex.slice import PARTS, PRESETS

    cv = sub.add_parser("convert", help="model -> vindex or HF directory; vindex -> GGUF or HF directory")
    cv.add_argument("src", help="alias, .gguf file, HF directory, or a vindex")
    cv.add_argument("output", help="the file or directory to write")
    cv.add_argument("--to", choices=TARGETS, default=None,
                    help="output format (default: vindex from a model; from a vindex, gguf for OUT.gguf, "
                         "else safetensors)")
    cv.add_argument("--dtype", choices=["f32", "f16", "bf16"], default=None,
                    help="safetensors: bf16 (default), f16, f32; vindex: f16 (default) or f32")
    cv.add_argument("--level", choices=["browse", "inference", "all"], default="inference",
                    help="vindex output level (default inference: the vindex runs the model)")
    cv.add_argument("--quant", choices=["source", "q4k"], default="source", help="vindex output, as in extract")
    cv.add_argument("--patch", action="append", metavar="P.vlp", help="apply to a vindex source first (repeatable)")
    cv.add_argument("--force", action="store_true", help="replace an existing output")
    cv.set_defaults(func=cmd_convert)

    sl = sub.add_parser("slice", help="copy the parts of a vindex a deployment needs into a new vindex")
    sl.add_argument("vindex")
    sl.add_argument("output", help="the vindex to create")
    how = sl.add_mutually_exclusive_group(required=True)
    how.add_argument("--preset", choices=list(PRESETS), help="browse, inference, client (no FFN), server (FFN only)")
    how.add_argument("--parts", help=f"comma-separated parts: {','.join(PARTS)}")
    sl.add_argument("--dry-run", action="store_true", help="print each part's size; write nothing")
    sl.add_argument("--force", action="store_true", help="replace an existing output")
    sl.set_defaults(func=cmd_slice)
