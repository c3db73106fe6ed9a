"""`larql serve` under load: requests/s and latency with 1, 8 and 32 concurrent clients on loopback.

    python benchmarks/bench_serve.py [VINDEX] [--seconds 8] [--workers 4] [--only infer,completion]
                                     [--batch 0,16]

The server runs as `larql serve` in its own process (so the clients' Python does not share its
GIL); the clients are asyncio tasks on one httpx.AsyncClient, each sending its next request when
the last one answered. Without VINDEX, gemma3-270m is extracted (inference level) to a temporary
directory first. The model's workloads (INFER, a 16-token completion) run once per --batch value
(0: one by one, today's default 16: batched), each on a fresh server. Writes
benchmarks/results/serve.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from results_file import save_results

# DESCRIBE runs on a browse-level vindex: on an inference-level one it also probes each relation
# template through the model (a minute of forward passes), which measures the model, not the server
WORKLOADS: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "health": ("GET", "/v1/health", None),
    "describe (browse vindex)": ("POST", "/v1/lql", {"query": 'DESCRIBE "France"'}),
    "walk": ("POST", "/v1/lql", {"query": 'WALK "The capital of France is" TOP 5'}),
    "select nearest": ("POST", "/v1/lql", {"query": 'SELECT * FROM EDGES NEAREST TO "France" AT LAYER 10 LIMIT 10'}),
    "infer": ("POST", "/v1/lql", {"query": 'INFER "The capital of France is" TOP 5'}),
    "completion (16 tokens)": ("POST", "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 16,
                                                            "temperature": 0}),
}
BATCHED = ("infer", "completion (16 tokens)")  # the workloads the server's batcher serves
CLIENTS = (1, 8, 32)


async def _load(url: str, workload: str, clients: int, seconds: float) -> dict[str, float]:
    method, path, body = WORKLOADS[workload]
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        async def client() -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                try:
                    r = await http.request(method, path, json=body)
                    errors += r.status_code != 200
                except httpx.TransportError:  # counted, not fatal: the figures say how many
                    errors += 1
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - t0
    lat = sorted(latencies)
    return {"requests": len(lat), "errors": errors, "rps": len(lat) / wall,
            "p50_ms": statistics.median(lat) * 1e3, "p95_ms": lat[int(0.95 * (len(lat) - 1))] * 1e3}


def _start(vindex: Path, workers: int, batch: int = 16) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "larql", "serve", str(vindex), "--port", "0", "--workers",
                             str(workers), "--batch", str(batch), "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True, env=env)
    m = re.search(r"at (http://\S+) ", proc.stderr.readline())  # type: ignore[union-attr]
    assert m, "the server did not start"
    url = m.group(1)
    for _ in range(600):
        try:
            httpx.get(f"{url}/v1/health")
            return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("the server does not answer")


def _measure(url: str, workload: str, seconds: float, batch: int) -> list[dict[str, Any]]:
    asyncio.run(_load(url, workload, 4, 1.0))  # warm: numba kernels, the tokenizer, the page cache
    rows = []
    for clients in CLIENTS:
        r = {"workload": workload, "batch": batch, "clients": clients,
             **asyncio.run(_load(url, workload, clients, seconds)), "load": os.getloadavg()[0]}
        if workload in BATCHED:
            r["batching"] = httpx.get(f"{url}/v1/info", timeout=60).json().get("batching")
        rows.append(r)
        print(f"| {workload} | batch {batch} | {clients} | {r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | "
              f"{r['errors']} | load {r['load']:.2f} |", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("vindex", nargs="?", help="an inference-level vindex (default: extract gemma3-270m)")
    ap.add_argument("--browse", help="a browse-level vindex for DESCRIBE (default: extract gemma3-270m)")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--only", default=None, help="comma-separated workloads (default: all)")
    ap.add_argument("--batch", default="0,16", help="the --batch values the model's workloads run with")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else set(WORKLOADS)
    batches = [int(b) for b in args.batch.split(",")]
    from larql.vindex.extract import extract

    tmp = Path(tempfile.mkdtemp())
    vindex = Path(args.vindex) if args.vindex else extract("gemma3-270m", tmp / "g.vindex", level="inference")
    plan = [(vindex, 16, [w for w in ("walk", "select nearest") if w in only])]
    plan += [(vindex, b, [w for w in BATCHED if w in only]) for b in batches]
    if only & {"health", "describe (browse vindex)"}:
        browse = Path(args.browse) if args.browse else extract("gemma3-270m", tmp / "gb.vindex", level="browse")
        plan.insert(0, (browse, 16, [w for w in ("health", "describe (browse vindex)") if w in only]))
    rows: list[dict[str, Any]] = []
    for served, batch, workloads in plan:
        if not workloads:
            continue
        proc, url = _start(served, args.workers, batch)
        try:
            for workload in workloads:
                rows += _measure(url, workload, args.seconds, batch)
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    save_results("serve", {"vindex": str(vindex), "workers": args.workers,
                           "seconds": args.seconds,
                           "cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
                           "numba_threads": os.environ.get("NUMBA_NUM_THREADS", "all"), "rows": rows})


if __name__ == "__main__":
    main()
