"""A result as text in a plain format: an HTML table (Jupyter), CSV, Markdown, and the cell text the
terminal table shows. Rendering only: the value (larql/lql/result.py) keeps its full precision.

It imports nothing from larql, so the Result value beside it can offer `_repr_html_` without the lql
layer reaching up to the shells (larql/shell/render.py draws the terminal's table from it). A "result" here is anything with
`title`, `columns`, `rows` and `notes` (a Result, or one rebuilt from `larql lql --json` lines).
"""

from __future__ import annotations

import csv
import html
import io
from typing import Any, Protocol


class Tabular(Protocol):
    title: str
    columns: list[str]
    rows: list[list[Any]]
    notes: list[str]


def cell_text(v: Any) -> str:
    """What a cell shows on screen: 4 significant digits for a float, so a small probability reads
    3.2e-06 rather than 0.0000 (one decimal past 10,000); anything else as str. The value itself is
    never rounded: handlers store full floats, and JSON and CSV carry them whole."""
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.1f}"
    return str(v)


def numeric_columns(result: Tabular) -> list[bool]:
    """Per column: every cell is a number (right-aligned in tables)."""
    return [bool(result.rows) and all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool)
                                      for r in result.rows) for i in range(len(result.columns))]


def to_html(result: Tabular, statement: str = "") -> str:
    """An HTML fragment: the title, a table (numbers right-aligned) and the notes, every text
    escaped (tokens such as "<bos>" or "</s>" are data, not markup)."""
    e = html.escape
    parts = ['<div class="larql-result">']
    if result.title or statement:
        parts.append(f"<strong>{e(result.title or statement)}</strong>")
    if result.columns:
        right = numeric_columns(result)
        align = ['style="text-align:right"' if r else 'style="text-align:left"' for r in right]
        parts.append("<table>")
        parts.append("<thead><tr>" + "".join(f"<th {a}>{e(str(c))}</th>" for c, a in zip(result.columns, align))
                     + "</tr></thead>")
        parts.append("<tbody>")
        for row in result.rows:
            parts.append("<tr>" + "".join(f"<td {a}>{e(cell_text(v))}</td>" for v, a in zip(row, align)) + "</tr>")
        parts.append("</tbody></table>")
    for note in result.notes:
        parts.append(f"<p><small>{e(note)}</small></p>")
    parts.append("</div>")
    return "\n".join(parts)


def to_csv(result: Tabular) -> str:
    """The header and the rows, values in full (repr-exact floats); nothing for a result without
    columns. Titles and notes are not data, so they are left out."""
    if not result.columns:
        return ""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows(result.rows)
    return buf.getvalue()


def _md(text: str) -> str:
    """A Markdown table cell: pipes escaped, a line break shown as \\n (a token "\\n" stays visible),
    HTML kept literal."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\r", "\\r").replace("\n", "\\n")


def to_markdown(result: Tabular) -> str:
    """The title in bold, a pipe table (numbers right-aligned), the notes as a list."""
    lines: list[str] = []
    if result.title:
        lines += [f"**{_md(result.title)}**", ""]
    if result.columns:
        right = numeric_columns(result)
        lines.append("| " + " | ".join(_md(str(c)) for c in result.columns) + " |")
        lines.append("|" + "|".join("---:" if r else "---" for r in right) + "|")
        lines += ["| " + " | ".join(_md(cell_text(v)) for v in row) + " |" for row in result.rows]
        lines.append("")
    lines += [f"- {_md(n)}" for n in result.notes]
    return "\n".join(lines).rstrip("\n") + "\n" if lines else ""
