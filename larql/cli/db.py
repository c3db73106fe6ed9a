"""The database commands of the CLI, thin shells over the vindex and larql.edit.bake.convert:

    larql extract SRC -o OUT [--level L] [--dtype D] [--quant Q] [--top-k K] [--force]
    larql verify VINDEX [--repair]
    larql convert SRC OUT [--to vindex|gguf|safetensors] [--dtype D] [--patch P.vlp]... [--force]
                                (SRC a LARQL vindex: into a larql vindex, browse level)
    larql slice VINDEX OUT (--preset browse|inference|client|server | --parts a,b,c) [--dry-run] [--force]

LARQL's spellings run the same commands: `larql extract-index SRC -o OUT` is extract,
`larql convert gguf-to-vindex X -o Y` (or safetensors-to-vindex) is `larql convert X Y --to vindex`,
and `larql slice VINDEX -o OUT --preset P` is `larql slice VINDEX OUT --preset P`.
"""

from __future__ import annotations

import argparse
import json
import sys

from larql.cli.common import output_bytes, run_with_progress, wrote
from larql.errors import LarqlError

# LARQL's `convert` subcommands: the source each one takes, and the native spelling it stands for
CONVERT_SPELLINGS = {"gguf-to-vindex": "a .gguf file", "safetensors-to-vindex": "a safetensors model directory"}


def cmd_extract(args: argparse.Namespace) -> int:
    from larql.lql.ops.lifecycle import extract_vindex

    (path, reused), console, seconds = run_with_progress(args, lambda report: extract_vindex(
        args.src, args.output, level=args.level, dtype=args.dtype, quant=args.quant, top_k=args.top_k,
        force=args.force, progress=report), f"extract {args.src}")
    size = output_bytes(path)
    if args.json:
        print(json.dumps({"path": str(path), "level": args.level, "bytes": size, "seconds": round(seconds, 2),
                          "reused": reused}))
    elif reused:
        console.print(f"{path} already holds this extraction ({size / 1e6:.1f} MB, level {args.level}): kept it "
                      f"(--force extracts again)", markup=False, highlight=False)
    else:
        console.print(wrote(path, after=f"level {args.level}", seconds=seconds), markup=False, highlight=False)
    counts = json.loads((path / "index.json").read_text()).get("requantized")
    if counts and not args.json and not reused:
        console.print(f"--quant q4k: {counts['Q4_K']} matrices now Q4_K, {counts['Q6_K']} Q6_K; "
                      f"{counts['kept']} kept their encoding (see FORMAT.md for which and why)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from larql.vindex.verify import repair, verify_vindex

    report = verify_vindex(args.path)
    problems = [f"{name} (contents differ from its sha256)" for name in report.bad_files] + report.config_diffs
    repaired = repair(args.path) if problems and args.repair else None
    if args.json:
        print(json.dumps({"path": str(args.path), "ok": report.ok, "files": report.files, "problems": problems,
                          "repaired": None if repaired is None else str(repaired)}))
    elif report.ok:
        print(f"{args.path}: ok ({report.files} files match index.json; {report.source_note})")
    elif repaired is not None:
        print(f"{args.path}: repaired ({'; '.join(problems)}): re-extracted into {repaired}")
    else:
        sys.stderr.write(f"larql: error: {args.path}: {'; '.join(problems)}; repair with larql verify --repair "
                         f"{args.path}, or re-extract it\n")
    return 0 if report.ok or repaired is not None else 1


def _one_output(command: str, positional: str | None, flag: str | None, usage: str) -> str:
    """The output named as a positional or with -o (LARQL's spelling), exactly once."""
    if positional is not None and flag is not None:
        raise LarqlError(f"{command}: the output is given twice ({positional} and -o {flag}); give it once")
    if positional is None and flag is None:
        raise LarqlError(f"{command}: no output given; {usage}")
    return positional if positional is not None else str(flag)


def convert_request(args: argparse.Namespace) -> tuple[str, str, str | None]:
    """(source, output, --to) of a `larql convert` line, in either spelling: native `SRC OUT`, or
    LARQL's `gguf-to-vindex SRC -o OUT` (safetensors-to-vindex likewise), which means `--to vindex`."""
    from pathlib import Path

    if args.src not in CONVERT_SPELLINGS:
        out = _one_output("convert", args.output, args.output_flag, "larql convert SRC OUT")
        return args.src, out, args.to
    kind, what = args.src, CONVERT_SPELLINGS[args.src]
    if args.output is None:
        raise LarqlError(f"convert {kind}: no source given; larql convert {kind} SRC -o OUT.vindex "
                         f"(SRC is {what})")
    src = args.output
    out = _one_output(f"convert {kind}", args.output_flag, None, f"larql convert {kind} {src} -o OUT.vindex")
    if args.to not in (None, "vindex"):
        raise LarqlError(f"convert {kind} writes a vindex, not --to {args.to}; drop --to, or use "
                         f"larql convert {src} OUT --to {args.to}")
    path = Path(src)
    if kind == "gguf-to-vindex" and path.is_dir():
        raise LarqlError(f"{src}: a directory, and gguf-to-vindex takes {what}; for a model directory use "
                         f"larql convert safetensors-to-vindex {src} -o {out}")
    if kind == "safetensors-to-vindex" and path.is_file() and path.suffix.lower() == ".gguf":
        raise LarqlError(f"{src}: a GGUF file, and safetensors-to-vindex takes {what}; use "
                         f"larql convert gguf-to-vindex {src} -o {out}")
    return src, out, "vindex"


def cmd_convert(args: argparse.Namespace) -> int:
    from larql.edit.bake.convert import convert

    src, out, to = convert_request(args)
    (fmt, path), console, seconds = run_with_progress(args, lambda report: convert(
        src, out, to=to, dtype=args.dtype, level=args.level, quant=args.quant,
        patches=args.patch or (), overwrite=args.force, progress=report))
    console.print(wrote(path, before=fmt, seconds=seconds))
    return 0


def cmd_slice(args: argparse.Namespace) -> int:
    from larql.vindex.slice import parse_parts, plan_slice, slice_vindex
    from larql.vindex.store import open_vindex

    args.output = _one_output("slice", args.output, args.output_flag,
                              "larql slice VINDEX OUT --preset P (or -o OUT)")
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
    print(wrote(path))
    return 0


def add_extract(sub: argparse._SubParsersAction) -> None:
    # shared with EXTRACT MODEL ... INTO; layout loads no numpy, so `larql --help` stays fast
    from larql.vindex.layout import EXTRACT_DEFAULTS, LEVELS

    ex = sub.add_parser("extract", aliases=["extract-index"],
                        help="decompile a model into a vindex directory (extract-index: LARQL's name for it)")
    ex.add_argument("src", help="alias, .gguf file, HF directory, or Hugging Face Hub id (org/name, hf://org/name@rev)")
    ex.add_argument("-o", "--output", required=True, help="the vindex directory to create (e.g. g.vindex)")
    ex.add_argument("--level", choices=LEVELS, default=EXTRACT_DEFAULTS["level"],
                    help="browse: no model weights; inference/all: the vindex runs the model (LQL: WITH INFERENCE)")
    ex.add_argument("--dtype", choices=["f16", "f32"], default=EXTRACT_DEFAULTS["dtype"],
                    help="embeddings and gate vectors")
    ex.add_argument("--quant", choices=["source", "q4k"], default=EXTRACT_DEFAULTS["quant"],
                    help="model weights: keep the source encoding (default) or requantize")
    ex.add_argument("--top-k", type=int, default=EXTRACT_DEFAULTS["top_k"],
                    help="output tokens kept per feature (default 10)")
    ex.add_argument("--force", action="store_true",
                    help="extract again over a vindex at the output (without it, the same extraction is reused and a different one refused)")
    ex.set_defaults(func=cmd_extract)


def add_verify(sub: argparse._SubParsersAction) -> None:
    ve = sub.add_parser("verify", help="check a vindex: index.json's seal and consistency, every file's sha256, "
                                       "model_config against the source model")
    ve.add_argument("path", help="the vindex directory")
    ve.add_argument("--repair", action="store_true", help="re-extract a damaged vindex from its (unchanged) source")
    ve.set_defaults(func=cmd_verify)


def add_commands(sub: argparse._SubParsersAction) -> None:
    from larql.edit.bake.convert import TARGETS
    from larql.vindex.slice import PARTS, PRESETS

    cv = sub.add_parser("convert", help="model -> vindex or HF directory; vindex -> GGUF or HF directory; "
                                        "LARQL's vindex -> vindex (browse level)")
    cv.add_argument("src", help="alias, .gguf file, HF directory, a vindex, or a vindex LARQL wrote (or LARQL's "
                                "gguf-to-vindex / safetensors-to-vindex, then the source and -o OUT)")
    cv.add_argument("output", nargs="?", help="the file or directory to write")
    cv.add_argument("-o", dest="output_flag", metavar="OUT", help="the output, LARQL's way (instead of OUT)")
    cv.add_argument("--to", choices=TARGETS, default=None,
                    help="output format (default: vindex from a model; from a vindex, gguf for OUT.gguf, "
                         "else safetensors)")
    cv.add_argument("--dtype", choices=["f32", "f16", "bf16"], default=None,
                    help="safetensors: bf16 (default), f16, f32; vindex: f16 (default) or f32")
    cv.add_argument("--level", choices=["browse", "inference", "all"], default=None,
                    help="vindex output level (default inference: the vindex runs the model; from a LARQL vindex "
                         "browse only, and --level browse leaves its model weights behind)")
    cv.add_argument("--quant", choices=["source", "q4k"], default="source", help="vindex output, as in extract")
    cv.add_argument("--patch", action="append", metavar="P.vlp", help="apply to a vindex source first (repeatable)")
    cv.add_argument("--force", action="store_true", help="replace an existing output")
    cv.set_defaults(func=cmd_convert)

    sl = sub.add_parser("slice", help="copy the parts of a vindex a deployment needs into a new vindex")
    sl.add_argument("vindex", help="the vindex to copy from")
    sl.add_argument("output", nargs="?", help="the vindex to create")
    sl.add_argument("-o", "--output", dest="output_flag", metavar="OUT", help="the vindex to create, LARQL's way (instead of OUT)")
    how = sl.add_mutually_exclusive_group(required=True)
    how.add_argument("--preset", choices=list(PRESETS), help="browse, inference, client (no FFN), server (FFN only)")
    how.add_argument("--parts", help=f"comma-separated parts: {','.join(PARTS)}")
    sl.add_argument("--dry-run", action="store_true", help="print each part's size; write nothing")
    sl.add_argument("--force", action="store_true", help="replace an existing output")
    sl.set_defaults(func=cmd_slice)
