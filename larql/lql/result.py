"""Result: what a statement returns — a value, its floats at full precision; rendering (rich tables,
HTML, Markdown: larql/lql/formats.cell_text) decides the digits shown, and JSON carries them whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from larql.errors import LarqlError


@dataclass
class Result:
    statement: str  # canonical LQL of the statement that produced it
    title: str = ""
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    elapsed_ms: float = 0.0
    steps: list[str] = field(default_factory=list)  # the plan's steps as they ran (EXPLAIN's lines)

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def _repr_html_(self) -> str:
        """Jupyter shows a result as an HTML table (larql/lql/formats.py renders it, escaped)."""
        from larql.lql.formats import to_html

        return to_html(self, self.statement)

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame with the result's columns (values as they are, unrounded)."""
        try:
            import pandas as pd  # type: ignore[import-untyped,unused-ignore]
        except ImportError:
            raise LarqlError("to_pandas() needs pandas, which is not installed; pip install pandas") from None
        return pd.DataFrame(self.rows, columns=self.columns)

    def to_json(self) -> dict[str, Any]:
        return {"statement": self.statement, "title": self.title, "columns": self.columns, "rows": self.rows,
                "notes": self.notes, "elapsed_ms": self.elapsed_ms}
