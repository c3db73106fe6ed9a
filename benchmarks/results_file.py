"""Where benchmark scripts leave their numbers: benchmarks/results/NAME.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def save_results(name: str, data: Any) -> Path:
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(data, indent=1))
    return out
