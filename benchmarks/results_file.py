"""Where benchmark scripts leave their numbers: benchmarks/results/NAME.json, stamped with the CPU
tier the kernels ran (the docs name it beside every speed figure: tools/render_docs.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def cpu_tier() -> str:
    """The kernels' tier on this machine (larql.quant.isa): AVX-512 VNNI int8 passes, AVX2 int8
    (down_meta's and the tiled greedy pass; the others float32), or their float32 forms."""
    from larql.quant import isa

    return {"avx512vnni": "avx512-vnni int8", "avx2": "avx2 int8"}.get(isa.TIER, "float32")


def with_tier(data: Any) -> Any:
    """`data` with the tier in its `machine` dict (or at the top when it has none), unless recorded."""
    if isinstance(data, dict):
        machine = data.get("machine")
        if isinstance(machine, dict):
            machine.setdefault("tier", cpu_tier())
        else:
            data.setdefault("tier", cpu_tier())
    return data


def save_results(name: str, data: Any) -> Path:
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    part = out.with_name(f".{out.name}.part")
    part.write_text(json.dumps(with_tier(data), indent=1))
    part.replace(out)  # atomic: a reader never sees half a file
    return out
