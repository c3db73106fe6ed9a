"""An SAE's feature labels from a file of explanations, as Neuronpedia exports them: a JSON array (or
JSON Lines) of objects with the feature's `index` (a number, or a string of one) and its
`description` (or `explanation`), or one JSON object mapping feature numbers to labels. A feature
with several explanations keeps the first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from larql.errors import ModelFormatError
from larql.io.jsonfile import parse_json, read_bounded

__all__ = ["load_feature_labels"]

MAX_BYTES = 1 << 30  # a 262k-feature SAE's explanations are tens of megabytes


def load_feature_labels(path: str | Path, d_sae: int) -> dict[int, str]:
    """{feature: label} for the features of an SAE of width `d_sae` that `path` explains."""
    p = Path(path).expanduser()
    text = read_bounded(p, MAX_BYTES, "file of feature explanations", ModelFormatError).decode("utf-8", "replace")
    stripped = text.lstrip()
    if stripped.startswith("{") and "\n{" in stripped.rstrip():  # JSON Lines: one object a line
        items: Any = [parse_json(line, f"{p}:{i}", 8, "explanation", ModelFormatError)
                      for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    else:
        items = parse_json(text, str(p), 8, "file of feature explanations", ModelFormatError)
    if isinstance(items, dict):
        items = [{"index": k, "description": v} for k, v in items.items()]
    if not isinstance(items, list):
        raise ModelFormatError(f"{p}: expected a JSON array of explanations (Neuronpedia's export) or an object "
                               f"mapping feature numbers to labels")
    labels: dict[int, str] = {}
    for item in items:
        index = item.get("index") if isinstance(item, dict) else None
        label = (item.get("description") or item.get("explanation")) if isinstance(item, dict) else None
        feature: int | None = None
        if isinstance(index, int) and not isinstance(index, bool):
            feature = index
        elif isinstance(index, str) and index.isdigit():
            feature = int(index)
        if feature is None or not isinstance(label, str):
            raise ModelFormatError(f"{p}: {str(item)[:80]} is not an explanation (an object with a feature number "
                                   f"'index' and a 'description' string)")
        if not 0 <= feature < d_sae:
            raise ModelFormatError(f"{p}: feature {feature} is out of range for this SAE (d_sae = {d_sae}): "
                                   f"explanations of another SAE?")
        labels.setdefault(feature, " ".join(label.split()))
    return labels
