"""The real-model-sizes table of docs/guide/performance.md, from benchmarks/results/scale.json
(benchmarks/bench_scale.py); tools/render_docs.py fills the `scale` block with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"**{ours / theirs:.2f}x**" if ours and theirs else "—"


def _figure(engine: dict[str, Any], key: str, digits: int) -> str:
    """A median with its lowest and highest round in brackets: a disturbed round shows."""
    rounds = engine.get(key.replace("_tok_s", "_rounds"), [])
    text = f"{engine[key]:.{digits}f}"
    return text + (f" [{min(rounds):.{digits}f}-{max(rounds):.{digits}f}]" if len(rounds) > 1 else "")


def _speed(row: dict[str, Any], key: str, digits: int) -> str:
    s = row["speed"]
    ours, theirs = s.get("larql", {}).get(key), s.get("llama.cpp", {}).get(key)
    if ours is None:
        return "not measured"
    text = f"{_figure(s['larql'], key, digits)} ({_ratio(ours, theirs)}"
    return text + (f"; llama.cpp {_figure(s['llama.cpp'], key, digits)})" if theirs else ")")


def _floor(row: dict[str, Any], copy_gb_s: float) -> str:
    """Decode as a fraction of the bandwidth floor: tok/s x bytes per token / copy GB/s."""
    def part(engine: str) -> str | None:
        dec = row["speed"].get(engine, {}).get("decode_tok_s")
        return f"{100 * dec * row['bytes_per_token'] / (copy_gb_s * 1e9):.0f}%" if dec else None

    ours, theirs = part("larql"), part("llama.cpp")
    if ours is None:
        return "—"
    text = f"{ours} (llama.cpp {theirs})" if theirs else str(ours)
    return f"{text}, {copy_gb_s:.1f} GB/s"


def _run(row: dict[str, Any], key: str, fmt: str) -> str:
    runs = row.get("run", {})
    ours, theirs = runs.get("larql", {}).get(key), runs.get("llama.cpp", {}).get(key)
    if ours is None:
        return "—"
    text = fmt.format(ours)
    if key == "peak_rss_mb":
        text += f" ({ours * 2**20 / row['gguf_bytes']:.1f}x the file)"
    return text + (f"; llama.cpp {fmt.format(theirs)}" if theirs is not None else "")


def render_scale() -> str:
    d = json.loads((RESULTS / "scale.json").read_text())
    rows = sorted(d["models"], key=lambda r: r["gguf_bytes"])  # smallest first, whichever run measured it
    bw = d["copy_gb_s"]
    head = ["| measure | " + " | ".join(f"{r['model']} ({r['gguf_bytes'] / 1e9:.2f} GB)" for r in rows) + " |",
            "|---|" + "---:|" * len(rows)]
    lines = [
        ("decode tok/s (vs llama.cpp)", [_speed(r, "decode_tok_s", 1) for r in rows]),
        ("decode as a share of the bandwidth floor (copy GB/s of the run)",
         [_floor(r, r.get("copy_gb_s", bw)) for r in rows]),
        (f"prefill {d['prompt']} tokens, tok/s (vs llama.cpp)", [_speed(r, "prefill_tok_s", 0) for r in rows]),
        (f"peak RSS of a `run` process ({d['run_tokens']} tokens), MB",
         [_run(r, "peak_rss_mb", "{:,.0f}") for r in rows]),
        ("time to first token of a new process, s", [_run(r, "first_token_s", "{:.1f}") for r in rows]),
        ("int8 repacked copies the matrices would take, MB (kept up to `LARQL_REPACK_MB`)",
         [f"{r['repack_bytes'] / 2**20:,.0f} of {r['repack_budget_bytes'] / 2**20:,.0f}" for r in rows]),
    ]
    body = [f"| {name} | " + " | ".join(cells) + " |" for name, cells in lines]
    m = d["machine"]
    loads = ", ".join(f"{r['model']} {r['load_average_start'][0]:.1f}-{r['load_average_end'][0]:.1f}" for r in rows)
    note = (f"{m['cpu']}, {m['threads']} threads, larql's tier {m.get('tier') or d.get('tier', '?')}; "
            f"llama-cpp-python {d.get('llama_cpp') or 'not installed'}; the shapes {d['quant'].upper()} by "
            f"llama.cpp's quantizer (gemma3-270m: the bundled file); bandwidth floor: the bytes one token reads "
            f"over a one-thread numpy copy's GB/s (bytes read plus written); decode "
            f"{d['decode']} greedy tokens, medians of {d['rounds']} rounds with llama.cpp in turn, the lowest and "
            f"highest round in brackets (llama.cpp's threads wait for each other by spinning, so one busy "
            f"moment elsewhere costs it a whole round). Load average "
            f"during each model's runs (the machine was shared): {loads}.")
    return "\n".join(head + body) + "\n\n" + note + "\n\nSource: `benchmarks/results/scale.json`."
