"""Decode with the FFN of some layers computed elsewhere: local, over the HTTP seam (`larql serve
--ffn-only`), and on Ray actors (larql/grid/), on loopback.

    python benchmarks/bench_ray.py [--tokens 24] [--rounds 3] [--calls 200]

gemma3-270m's layers 4-11 (8 of 18) go remote, split into 1, 2 and 4 shards (0 shards: the local
model); each configuration decodes the same greedy tokens (checked), the configurations in turn in
each round, medians over the rounds. Then one remote layer's call alone, one row (a decode step's),
local vs HTTP vs Ray, the per-token cost a remote layer adds. Client, servers and actors share this
machine's cores. Writes benchmarks/results/ray.json with the load average before and after and the
inputs of the scale-out doc's paper simulation (tools/render_ray.py renders both).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from results_file import save_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = "The capital of France is"
REMOTE = (4, 11)
SPLITS = (1, 2, 4)
# the scale-out doc's paper simulation (tools/render_ray.py computes it from these and the measured
# call overhead): a dense 31B-parameter model of the public ~30B shape (60 layers, width 5120, FFN
# 25600: 3 x 5120 x 25600 x 60 = 23.6B FFN weights) in Q4_K, its FFN on servers reading weights at
# `server_memory_gb_s`, linked to the client at `link_gbit_s`, for round-trip times `rtt_ms`
PAPER = {"model": "a dense 31B model", "layers": 60, "hidden": 5120, "ffn": 25600, "ffn_bits_per_weight": 4.5,
         "server_memory_gb_s": 100.0, "link_gbit_s": 10.0, "rtt_ms": [0.05, 0.2, 1.0, 5.0],
         "targets_tok_s": [1, 5, 10, 20]}


def split(n: int) -> list[tuple[int, int]]:
    a, b = REMOTE
    size = (b - a + 1) // n
    return [(a + k * size, a + (k + 1) * size - 1) for k in range(n)]


def decode_tps(model: Any, n: int) -> tuple[float, list[int]]:
    ids, first = [], None
    for tok, _ in model.stream(model.tokenize(PROMPT), max_new_tokens=n):
        first = first or time.perf_counter()
        ids.append(tok)
    assert first is not None
    return (len(ids) - 1) / (time.perf_counter() - first), ids


def http_server(stack: ExitStack, layers: tuple[int, int]) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "larql", "serve", "gemma3-270m", "--ffn-only", "--layers",
                             f"{layers[0]}-{layers[1]}", "--port", "0", "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True, env=env)
    stack.callback(lambda: (proc.terminate(), proc.wait(timeout=60)))
    line = proc.stderr.readline()  # type: ignore[union-attr]
    m = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
    if not m:
        raise SystemExit(f"larql serve did not start: {line}")
    return m.group(1)


def call_ms(fn: Any, calls: int) -> float:
    fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=200, help="calls of the one-layer measurement")
    args = ap.parse_args()

    import ray

    import larql
    import larql.quant.tensor as tensor
    from larql.cli.benchmark import machine
    from larql.grid.client import RayGrid
    from larql.grid.cluster import Options
    from larql.model.remote_ffn import use_remote_ffn

    tensor._repack_budget[0] = 1 << 40  # every model in this process on the same kernels as the servers'
    info = machine()
    local = larql.load("gemma3-270m")
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    with ExitStack() as stack:
        models: dict[str, Any] = {"local": local}
        grids: dict[int, Any] = {}
        for n in SPLITS:
            spans = split(n)
            grid = RayGrid.start(str(local.source), local, ",".join(f"{a}-{b}" for a, b in spans),
                                 options=Options(cpus=0.5))
            stack.callback(grid.close)
            grids[n] = grid
            models[f"ray {n}"] = grid.attach(local)
            http = local
            for span in spans:
                http = use_remote_ffn(http, http_server(stack, span))
            models[f"http {n}"] = http
        f16 = RayGrid.start(str(local.source), local, f"{REMOTE[0]}-{REMOTE[1]}", options=Options(cpus=0.5, float16=True))
        stack.callback(f16.close)
        models["ray 1 float16"] = f16.attach(local)

        want = local.generate(PROMPT, max_new_tokens=args.tokens).ids
        rounds: dict[str, list[float]] = {k: [] for k in models}
        exact: dict[str, bool] = {}
        for _ in range(args.rounds):
            for name, m in models.items():
                tps, ids = decode_tps(m, args.tokens)
                rounds[name].append(tps)
                exact[name] = exact.get(name, True) and ids == want
            print({k: round(v[-1], 1) for k, v in rounds.items()}, flush=True)

        # one remote layer's call alone: a decode step's one row, there and back
        h = np.random.default_rng(0).standard_normal((1, local.config.hidden)).astype(np.float32)
        layer = REMOTE[0]
        one = {"local": call_ms(lambda: local.ffn_block(layer, h), args.calls),
               "http": call_ms(lambda: models["http 1"].ffn_block(layer, h), args.calls),
               "ray": call_ms(lambda: grids[1].groups[0].call("layer", "ffn", layer, h), args.calls),
               "ray float16": call_ms(lambda: f16.groups[0].call("layer", "ffn", layer, h.astype(np.float16)),
                                      args.calls)}
    ray.shutdown()
    remote_layers = REMOTE[1] - REMOTE[0] + 1
    med = {k: statistics.median(v) for k, v in rounds.items()}
    configs = [{"name": name, "shards": 0 if name == "local" else int(name.split()[1]),
                "transport": name.split()[0] + (" float16" if "float16" in name else ""),
                "remote_layers": 0 if name == "local" else remote_layers,
                "decode_tok_s": round(med[name], 2), "rounds": [round(x, 2) for x in rounds[name]],
                "same_tokens": exact[name],
                "ms_per_token": round(1000 / med[name], 2),
                "overhead_ms_per_remote_layer": (None if name == "local" else
                                                 round((1000 / med[name] - 1000 / med["local"]) / remote_layers, 3))}
               for name in models]
    out = {"model": "gemma3-270m", "hidden": local.config.hidden, "layers": local.config.n_layers,
           "remote": list(REMOTE), "tokens": args.tokens, "prompt": PROMPT, "rounds": args.rounds,
           "machine": info, "load_average_end": [round(x, 2) for x in os.getloadavg()],
           "ray": ray.__version__, "configs": configs,
           "one_layer_call_ms": {k: round(v, 3) for k, v in one.items()}, "one_layer_calls": args.calls,
           "paper": PAPER}
    print(save_results("ray", out))
    for c in configs:
        print(c)
    print(out["one_layer_call_ms"])


if __name__ == "__main__":
    main()
