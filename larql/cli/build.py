"""`larql build DIR [--output X] [--stage NAME] [--force] [--cache C]`: a thin shell over larql.vindexfile.run."""

from __future__ import annotations

import argparse

from larql.cli.common import run_with_progress, wrote


def cmd_build(args: argparse.Namespace) -> int:
    from larql.vindexfile.run import build

    report, console, seconds = run_with_progress(args, lambda progress: build(
        args.dir, args.output, stage=args.stage, force=args.force, cache=args.cache, progress=progress))
    for r in report.runs:
        how = "cached" if r.cached else f"{r.seconds:.1f}s"
        console.print(f"  {'L' + str(r.step.line) if r.step.line else '':<5} {r.step.text:<60.60} {how}")
    console.print(f"{wrote(report.output, seconds=seconds)}; "
                  f"{len(report.ran)} of {len(report.runs)} steps ran, the rest came from the cache")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("build", help="build the Vindexfile in DIR into a vindex (cached, reproducible, atomic)")
    b.add_argument("dir", nargs="?", default=".", help="the directory holding the Vindexfile (default: .)")
    b.add_argument("-o", "--output", default=None, help="the vindex to write (default: DIR/build.vindex)")
    b.add_argument("--stage", default=None, help="build up to the end of this STAGE")
    b.add_argument("--force", action="store_true", help="replace an existing output")
    b.add_argument("--cache", default=None, help="the step cache (default: DIR/.larql-build)")
    b.set_defaults(func=cmd_build)
