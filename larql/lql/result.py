"""Result: what a statement returns — a value; rendering (rich tables, JSON) is separate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Result:
    statement: str  # canonical LQL of the statement that produced it
    title: str = ""
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    elapsed_ms: float = 0.0

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def to_json(self) -> dict[str, Any]:
        return {"statement": self.statement, "title": self.title, "columns": self.columns, "rows": self.rows,
                "notes": self.notes, "elapsed_ms": round(self.elapsed_ms, 3)}
