"""Results -> terminal output (rich tables) or JSON. Shared by `larql lql` and the REPL."""

from __future__ import annotations

import json
import re
import textwrap
from typing import IO, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from larql.lql.formats import cell_text, to_csv, to_markdown
from larql.lql.result import Result

FORMATS = ("table", "json", "csv", "markdown")


def _cell(v: Any) -> Text:
    """Plain text, never markup: tokens such as "[/INST]" or "[capital]" must print as they are."""
    return Text(cell_text(v))


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
        print_wrapped(console, note, indent="  ", style="dim")
    if timing:
        console.print(f"  ({result.elapsed_ms:.1f} ms)", style="dim")


# where a note may break: after ", " or "; ", or before " (", never inside "model: gemma3-270m"
_BREAKS = re.compile(r"(?<=[,;]) | (?=\()")


def wrap_line(text: str, width: int, indent: str = "") -> list[str]:
    """`text` in lines of at most `width` columns, broken between its parts ("key: value", a
    parenthesis) rather than inside one; a part longer than a line breaks at its spaces.
    Continuation lines are indented two more columns."""
    room = max(20, width - len(indent) - 2)  # what a continuation line holds (the first: 2 more)
    parts: list[str] = []
    for part in _BREAKS.split(text):
        parts += [part] if len(part) <= room else textwrap.wrap(part, room, break_long_words=False, break_on_hyphens=False) or [part]
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + 1 + len(part) <= room + (2 if len(lines) == 1 else 0):
            lines[-1] += " " + part
        else:
            lines.append(part)
    return [indent + ("  " if i else "") + line for i, line in enumerate(lines)]


def print_wrapped(console: Console, text: str, indent: str = "", style: str = "") -> None:
    """Print plain text (no markup) wrapped by `wrap_line` at the console's width."""
    for line in wrap_line(text, console.width, indent):
        console.print(Text(line, style=style), soft_wrap=True)


def render_json(result: Result, out: IO[str]) -> None:
    out.write(json.dumps(result.to_json(), ensure_ascii=False, default=str) + "\n")


def render_as(fmt: str, result: Result, console: Console, out: IO[str], first: bool, timing: bool = False) -> bool:
    """One result in `larql lql --format FMT`: a rich table, a JSON line, or a CSV / Markdown block
    (blocks after the first start with a blank line). Returns whether it wrote anything."""
    if fmt == "table":
        render(result, console, timing=timing)
    elif fmt == "json":
        render_json(result, out)
    else:
        text = to_csv(result) if fmt == "csv" else to_markdown(result)
        if not text:
            return False
        out.write(("" if first else "\n") + text)
    return True
