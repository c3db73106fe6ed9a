"""The scale-out doc's Ray tables, from benchmarks/results/ray.json (benchmarks/bench_ray.py):
`ray`, decode with remote shards on loopback (local, HTTP, Ray); `ray-paper`, the paper simulation of
a 31B model's FFN over a network, computed from the file's inputs and its measured call overhead.
tools/render_docs.py fills both blocks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
NAME = "ray"


def _load() -> dict[str, Any]:
    return json.loads((RESULTS / f"{NAME}.json").read_text())


def _setting(d: dict[str, Any]) -> str:
    m = d["machine"]
    return (f"{m['cpu']}, {m['cpus']} cpus, {m['threads']} threads, kernel tier {m.get('tier', 'not recorded')}; "
            f"client, HTTP servers and Ray actors on the same cores; load average {m['load_average'][0]:.2f} at the "
            f"start, {d['load_average_end'][0]:.2f} at the end; Ray {d['ray']}. Source: `benchmarks/results/{NAME}.json`"
            f" (`benchmarks/bench_ray.py`).")


def render_ray() -> str:
    d = _load()
    a, b = d["remote"]
    out = ["| shards | transport | decode tok/s (median; rounds) | ms per token | added ms per remote layer | "
           "same tokens as local |", "|---:|---|---:|---:|---:|---|"]
    for c in d["configs"]:
        rounds = ", ".join(f"{x:.1f}" for x in c["rounds"])
        extra = "—" if c["overhead_ms_per_remote_layer"] is None else f"{c['overhead_ms_per_remote_layer']:.2f}"
        out.append(f"| {c['shards']} | {c['transport']} | {c['decode_tok_s']:.1f} ({rounds}) | {c['ms_per_token']:.1f} | "
                   f"{extra} | {'yes' if c['same_tokens'] else 'no'} |")
    one = d["one_layer_call_ms"]
    calls = ", ".join(f"{k} {v:.2f} ms" for k, v in one.items())
    return ("\n".join(out) + f"\n\n{d['model']}, layers {a}-{b} ({b - a + 1} of {d['layers']}) remote, split evenly "
            f"over the shards; {d['tokens']} greedy tokens, {d['rounds']} rounds, the configurations in turn. One "
            f"layer's FFN on one row (a decode step), median of {d['one_layer_calls']} calls: {calls}. " + _setting(d))


def _mb(x: float) -> str:
    return f"{x / 1e6:.2f} MB" if x >= 1e6 else f"{x / 1e3:.0f} KB"


def render_ray_paper() -> str:
    d = _load()
    p = d["paper"]
    layers, hidden = p["layers"], p["hidden"]
    per_layer = {"float32": 2 * hidden * 4, "float16": 2 * hidden * 2}  # the rows there and back, one token
    per_token = {k: v * layers for k, v in per_layer.items()}
    ffn_bytes = 3 * hidden * p["ffn"] * layers * p["ffn_bits_per_weight"] / 8
    compute_s = ffn_bytes / (p["server_memory_gb_s"] * 1e9)
    one = d["one_layer_call_ms"]
    overhead_ms = max(0.0, one["ray"] - one["local"])  # Ray's software cost of one call, measured on loopback
    link = p["link_gbit_s"] * 1e9 / 8  # bytes per second
    lines = [f"{p['model']} ({layers} layers, width {hidden}, FFN {p['ffn']}; "
             f"{3 * hidden * p['ffn'] * layers / 1e9:.1f}B FFN weights at {p['ffn_bits_per_weight']:g} bits), every "
             f"layer's FFN on shards, one sequence decoding:", "",
             "| per token | float32 rows | float16 rows |", "|---|---:|---:|",
             f"| bytes per layer (there and back) | {_mb(per_layer['float32'])} | {_mb(per_layer['float16'])} |",
             f"| bytes per token ({layers} layers) | {_mb(per_token['float32'])} | {_mb(per_token['float16'])} |",
             f"| round trips per token | {layers} | {layers} |",
             f"| FFN weights read per token (on the shards) | {ffn_bytes / 1e9:.1f} GB | {ffn_bytes / 1e9:.1f} GB |",
             "",
             f"Time per token = {layers} round trips + bytes / link ({p['link_gbit_s']:g} Gbit/s), then "
             f"{layers} x Ray's cost of a call ({overhead_ms:.2f} ms, measured above on a busy 2-core machine), then "
             f"the FFN's weights read at {p['server_memory_gb_s']:g} GB/s ({1000 * compute_s:.0f} ms; attention on "
             f"the client not counted):", "",
             "| round trip | network ms per token | tok/s: network alone | + Ray's call cost | + the FFN's reads |",
             "|---:|---:|---:|---:|---:|"]
    for rtt in p["rtt_ms"]:
        net_s = layers * rtt / 1000 + per_token["float32"] / link
        calls_s = net_s + layers * overhead_ms / 1000
        lines.append(f"| {rtt:g} ms | {1000 * net_s:.1f} | {1 / net_s:.1f} | {1 / calls_s:.1f} | "
                     f"{1 / (calls_s + compute_s):.1f} |")
    lines += ["", "What the network must give for N tok/s, leaving it half of each token's time:", "",
              "| tok/s | link bandwidth (float32 rows) | largest round trip per layer | the same after Ray's call cost |",
              "|---:|---:|---:|---:|"]
    for n in p["targets_tok_s"]:
        rtt_net = 1000 * (0.5 / n) / layers
        rtt_ray = rtt_net - overhead_ms
        bw = per_token["float32"] * n * 8 / 1e6  # Mbit/s
        lines.append(f"| {n} | {bw:.0f} Mbit/s | {rtt_net:.2f} ms | "
                     f"{f'{rtt_ray:.2f} ms' if rtt_ray > 0 else 'none: the calls alone take it'} |")
    return "\n".join(lines) + "\n\n" + f"Inputs: `benchmarks/results/{NAME}.json` (`paper`, and the call overhead above)."
