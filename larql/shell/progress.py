"""Progress for long statements, on stderr, shared by `larql lql`, `larql extract` and the REPL.

Each statement gets its own display: a spinner naming it, plus one bar per stage it reports
(extraction's layers, DESCRIBE's probes, INSERT's steps). The display appears only once the
statement has run for `delay` seconds (short ones never flicker), and it is transient: it is
erased when the statement ends, before its results are printed, so a result never sits under a
bar and no bar of an earlier statement is left on the screen.

Nothing is drawn unless stderr is a terminal: in a pipe, with --json or --quiet there are no bars
and no escape codes at all.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console

DELAY_ENV = "LARQL_PROGRESS_DELAY"  # seconds before a statement's display appears (default 1)


def _delay() -> float:
    try:
        return max(0.0, float(os.environ.get(DELAY_ENV, "1")))
    except ValueError:
        return 1.0


class StatementProgress:
    """Per-statement transient progress; `report(stage, done, total)` is the callback long
    operations take (Session.progress, extract's progress)."""

    def __init__(self, console: Console | None = None, enabled: bool = True) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal and not self.console.is_dumb_terminal
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    @contextmanager
    def statement(self, label: str) -> Iterator[None]:
        """Show progress for one statement while the block runs; erased when it ends."""
        if not self.enabled:
            yield
            return
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._tasks = {}
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  TextColumn("{task.fields[count]}"), TimeElapsedColumn(), console=self.console,
                                  transient=True)
        short = label if len(label) <= 48 else label[:45] + "..."
        self._progress.add_task(short, total=None, count="")
        timer = threading.Timer(_delay(), self._progress.start)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            timer.join()  # a start that was already under way finishes before we stop it
            self._progress.stop()  # transient: erases the display (a no-op if it never started)
            self._progress = None

    def report(self, stage: str, done: int, total: int) -> None:
        if self._progress is None:
            return
        if stage not in self._tasks:
            self._tasks[stage] = self._progress.add_task(f"  {stage}", total=total, count="")
        self._progress.update(self._tasks[stage], completed=done, total=total, count=f"{done}/{total}")
