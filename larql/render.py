"""Results -> terminal output (rich tables) or JSON. Shared by `larql lql` and the REPL."""

from __future__ import annotations

import json
from typing import IO, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from larql.lql.result import Result


def _cell(v: Any) -> Text:
    """Plain text, never markup: tokens such as "[/INST]" or "[capital]" must print as they are."""
    if isinstance(v, float):
        return Text(f"{v:.4g}" if abs(v) < 1e4 else f"{v:.1f}")
    return Text(str(v))


def render(result: Result, console: Console, timing: bool = False) -> None:
    if result.title:  # above the table, not as its title: rich wraps a title to the table's width
        console.print(Text(result.title, style="bold"))
    if result.columns and result.rows:
        table = Table(show_lines=False)
        for col in result.columns:
            numeric = all(isinstance(r[result.columns.index(col)], (int, float)) for r in result.rows)
            table.add_column(col, justify="right" if numeric else "left")
        for row in result.rows:
            table.add_row(*(_cell(v) for v in row))
        console.print(table)
    for note in result.notes:
        console.print(f"  {note}", style="dim", markup=False, highlight=False)
    if timing:
        console.print(f"  ({result.elapsed_ms:.1f} ms)", style="dim")


def render_json(result: Result, out: IO[str]) -> None:
    out.write(json.dumps(result.to_json(), ensure_ascii=False, default=str) + "\n")
