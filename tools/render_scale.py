"""The real-model-sizes table of docs/guide/performance.md, from benchmarks/results/scale.json
(benchmarks/bench_scale.py); tools/render_docs.py fills the `scale` block with it.

A model the README's speed table also measures (the bundled gemma3-270m) takes its decode and prefill
from that table's results file, so the docs show one figure for it, with that run's setting stated."""

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


def _speed_from(runtime: dict[str, Any], model: str) -> dict[str, Any] | None:
    """A model's per-engine speed as a `larql bench` results file records it (None if it has no larql row)."""
    keys = ("prefill_tok_s", "decode_tok_s", "prefill_rounds", "decode_rounds")
    speed = {e["engine"]: {k: e[k] for k in keys if k in e} for e in runtime["engines"] if e["model"] == model}
    return speed if "larql" in speed else None


def render_scale(speed_run: str | None = None) -> str:
    """The table; `speed_run` names the README's `larql bench` results file, whose models take their
    speed from it."""
    d = json.loads((RESULTS / "scale.json").read_text())
    rows = sorted(d["models"], key=lambda r: r["gguf_bytes"])  # smallest first, whichever run measured it
    runtime = json.loads((RESULTS / f"{speed_run}.json").read_text()) if speed_run else None
    borrowed = []
    for r in rows:
        speed = _speed_from(runtime, r["model"]) if runtime else None
        if speed:
            r["speed"] = speed
            borrowed.append(r["model"])
    bw = d["copy_gb_s"]
    head = ["| measure | " + " | ".join(f"{r['model']} ({r['gguf_bytes'] / 1e9:.2f} GB"
                                         + ("; speed: the README's run" if r["model"] in borrowed else "") + ")"
                                         for r in rows) + " |",
            "|---|" + "---:|" * len(rows)]
    lines = [
        ("decode tok/s (vs llama.cpp)", [_speed(r, "decode_tok_s", 1) for r in rows]),
        ("decode as a share of the bandwidth floor (copy GB/s measured in the scale run)",
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
    loads = ", ".join(f"{r['model']} {r['load_average_start'][0]:.1f}-{r['load_average_end'][0]:.1f}"
                      + (" (its memory and first token)" if r["model"] in borrowed else "") for r in rows)
    measured = "the shapes'" if borrowed else "the"
    note = (f"{m['cpu']}, {m['threads']} threads, larql's tier {m.get('tier') or d.get('tier', '?')}; "
            f"llama-cpp-python {d.get('llama_cpp') or 'not installed'}; the shapes {d['quant'].upper()} by "
            f"llama.cpp's quantizer (gemma3-270m: the bundled file); bandwidth floor: the bytes one token reads "
            f"over a one-thread numpy copy's GB/s (bytes read plus written); {measured} decode "
            f"{d['decode']} greedy tokens, medians of {d['rounds']} rounds with llama.cpp in turn, the lowest and "
            f"highest round in brackets (llama.cpp's threads wait for each other by spinning, so one busy "
            f"moment elsewhere costs it a whole round).")
    sources = ["scale"]
    if borrowed and runtime:
        rm = runtime["machine"]
        end = runtime.get("load_average_end")
        note += (f" {' and '.join(borrowed)}'s decode and prefill are the README's speed table's run, so a model "
                 f"has one figure in these docs: prefill of {runtime['prompt']} tokens, {runtime['decode']} greedy "
                 f"decode tokens, medians of {runtime.get('rounds', 1)} rounds, load average "
                 f"{rm['load_average'][0]:.1f}" + (f"-{end[0]:.1f}" if end else "") + ".")
        sources.append(str(speed_run))
    note += f" Load average during each model's runs of the scale run (the machine was shared): {loads}."
    return ("\n".join(head + body) + "\n\n" + note + "\n\nSource: "
            + ", ".join(f"`benchmarks/results/{s}.json`" for s in sources) + ".")
