"""What the command modules share: one progress display around a long command, the size of what it
wrote and the "wrote X (N MB) in Ys" line, and a sink that prints LQL results in an output format."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from larql.lql.result import Result

T = TypeVar("T")


def run_with_progress(args: argparse.Namespace, work: Callable[[Callable[[str, int, int], None]], T],
                      label: str = "") -> tuple[T, Any, float]:
    """Run `work(report)` under one transient progress display on stderr (none with --quiet or
    --json, or when stderr is not a terminal); returns its result, the stderr console and the
    seconds taken. Threads were set by main() before numpy loaded."""
    from rich.console import Console

    from larql.shell.progress import StatementProgress

    console = Console(stderr=True)
    t0 = time.perf_counter()
    bars = StatementProgress(console, enabled=not (args.quiet or args.json))
    with bars.statement(label or args.command):
        out = work(bars.report)
    return out, console, time.perf_counter() - t0


def output_bytes(path: str | Path) -> int:
    """The size of an output: a file's, or the sum of a directory's files (a vindex is flat)."""
    p = Path(path)
    return sum(f.stat().st_size for f in p.iterdir()) if p.is_dir() else p.stat().st_size


def wrote(path: str | Path, *, before: str = "", after: str = "", seconds: float | None = None) -> str:
    """The line a command prints when its output is complete, e.g. "wrote g.vindex (f16, 12.3 MB,
    level browse) in 4.1s": `before` and `after` go either side of the size in the parentheses."""
    inside = ", ".join(part for part in (before, f"{output_bytes(path) / 1e6:.1f} MB", after) if part)
    return f"wrote {path} ({inside})" + (f" in {seconds:.1f}s" if seconds is not None else "")


def result_printer(fmt: str, width: int | None = None, timing: bool = False) -> Callable[[Result], None]:
    """A sink for lql.script.run_text: each result on stdout as `fmt` (table, json, csv or markdown;
    only a table has colour), csv and markdown blocks separated by a blank line."""
    from rich.console import Console

    from larql.shell.render import render_as

    console = Console(file=sys.stdout, width=width, no_color=fmt != "table")
    first = True  # nothing written yet

    def sink(result: Result) -> None:
        nonlocal first
        if render_as(fmt, result, console, sys.stdout, first=first, timing=timing):
            first = False

    return sink
