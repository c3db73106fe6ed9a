"""Memory of editing sessions opened, edited and dropped one after another, in one Python process and
in `larql serve --allow-edits`: whether a session that ends gives back what it took.

    python benchmarks/bench_session_memory.py VINDEX [--python-sessions 200] [--http-sessions 200]
                                              [--together] [--name session-memory]

Python: a fresh process opens the vindex (`larql.edit_vindex`), INSERTs one fact (`insert_facts`, the
report included), drops the view and runs `gc.collect()`, N times. HTTP: `larql serve VINDEX
--allow-edits` in its own process; each session is one client's INSERT through /v1/lql and its DELETE
/v1/session. After each session the process's anonymous memory (RssAnon, /proc/PID/status) is
recorded; the figure that matters is its growth per session after the first (a least-squares slope),
since the first also sets the allocator's high-water mark and makes the server's shared state. The
Python process ends with malloc_trim(0): what is left then is live, the rest of its RssAnon was freed
memory that glibc kept for reuse. --together runs the two soaks at once (half the wall time; each
session's seconds then count the other's load). Writes benchmarks/results/NAME.json with the machine's
description.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from results_file import save_results

from larql.cli.benchmark import machine

# (subject, prompt, new target, relation, true target), taken in turn: every session edits afresh
FACTS = (("France", "The capital of France is", "Rome", "capital", "Paris"),
         ("Germany", "The capital of Germany is", "Madrid", "capital", "Berlin"),
         ("Japan", "The capital of Japan is", "Lisbon", "capital", "Tokyo"),
         ("Italy", "The capital of Italy is", "Vienna", "capital", "Rome"))


def rss_anon_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024


def slope(ys: list[float]) -> float:
    """MB per session: the least-squares slope of ys over their index."""
    if len(ys) < 2:
        return 0.0
    xs = range(len(ys))
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def summary(start: float, after: list[float], seconds: list[float]) -> dict[str, Any]:
    rest = after[1:]
    return {"sessions": len(after), "start_mb": round(start, 1), "after_first_mb": round(after[0], 1),
            "last_mb": round(after[-1], 1), "max_after_first_mb": round(max(rest), 1) if rest else None,
            "mb_per_session_after_first": round(slope(rest), 2),
            "median_seconds_per_session": round(statistics.median(seconds), 2),
            "rss_anon_mb": [round(x, 1) for x in after], "seconds": [round(x, 2) for x in seconds]}


def python_child(vindex: str, n: int) -> None:
    """The Python soak, in this (fresh) process: one JSON line per session on stdout."""
    import larql
    from larql.edit.insert import insert_facts
    from larql.edit.methods.facts import Fact

    print(json.dumps({"start_mb": rss_anon_mb()}), flush=True)
    for i in range(n):
        t0 = time.perf_counter()
        v = larql.edit_vindex(vindex)
        insert_facts(v, [Fact(*FACTS[i % len(FACTS)])])
        del v
        gc.collect()
        print(json.dumps({"rss_anon_mb": rss_anon_mb(), "seconds": time.perf_counter() - t0}), flush=True)
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    print(json.dumps({"trimmed_mb": rss_anon_mb()}), flush=True)


Progress = Callable[[str, dict[str, Any]], None]


def python_soak(vindex: Path, n: int, progress: Progress) -> dict[str, Any]:
    proc = subprocess.Popen([sys.executable, __file__, str(vindex), "--python-child", str(n)],
                            stdout=subprocess.PIPE, text=True)
    start, after, seconds, trimmed = 0.0, [], [], None
    for line in proc.stdout:  # type: ignore[union-attr]
        row = json.loads(line)
        if "start_mb" in row:
            start = row["start_mb"]
        elif "trimmed_mb" in row:
            trimmed = row["trimmed_mb"]
        else:
            after.append(row["rss_anon_mb"])
            seconds.append(row["seconds"])
            print(f"python session {len(after)}: RssAnon {after[-1]:.0f} MB ({seconds[-1]:.1f} s)", file=sys.stderr)
            progress("python", summary(start, after, seconds))
    if proc.wait() != 0:
        raise SystemExit(f"the Python soak failed ({proc.returncode})")
    return summary(start, after, seconds) | {"after_malloc_trim_mb": round(trimmed, 1) if trimmed else None}


def http_soak(vindex: Path, n: int, progress: Progress) -> dict[str, Any]:
    proc = subprocess.Popen([sys.executable, "-m", "larql", "serve", str(vindex), "--port", "0", "--allow-edits",
                             "--timeout", "900", "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True, cwd=vindex.parent)
    try:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        found = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        if not found:
            raise SystemExit(f"larql serve did not start: {line}")
        url = found.group(1)
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # type: ignore[union-attr]  # never a full pipe
        while True:
            try:
                httpx.get(f"{url}/v1/health")
                break
            except httpx.TransportError:
                time.sleep(0.2)
        start, after, seconds = rss_anon_mb(proc.pid), [], []
        for i in range(n):
            subject, prompt, target, relation, _ = FACTS[i % len(FACTS)]
            query = (f'INSERT INTO EDGES (entity, relation, target, prompt) VALUES ("{subject}", "{relation}", '
                     f'"{target}", "{prompt}")')
            t0 = time.perf_counter()
            r = httpx.post(f"{url}/v1/lql", json={"query": query}, timeout=900)
            if r.status_code != 200:
                raise SystemExit(f"INSERT failed: {r.text}")
            d = httpx.delete(f"{url}/v1/session", headers={"X-Larql-Session": r.headers["x-larql-session"]})
            if d.status_code != 200:
                raise SystemExit(f"DELETE /v1/session failed: {d.text}")
            seconds.append(time.perf_counter() - t0)
            after.append(rss_anon_mb(proc.pid))
            print(f"http session {i + 1}: server RssAnon {after[-1]:.0f} MB ({seconds[-1]:.1f} s)", file=sys.stderr)
            progress("http", summary(start, after, seconds))
        return summary(start, after, seconds)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vindex", type=Path, help="an inference-level vindex (its statistics are cached beside it)")
    parser.add_argument("--python-sessions", type=int, default=200)
    parser.add_argument("--http-sessions", type=int, default=200)
    parser.add_argument("--together", action="store_true", help="run the Python and HTTP soaks at once")
    parser.add_argument("--name", default="session-memory", help="benchmarks/results/NAME.json")
    parser.add_argument("--python-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.python_child is not None:
        python_child(str(args.vindex), args.python_child)
        return
    out: dict[str, Any] = {"machine": machine(), "vindex": str(args.vindex), "each_session": "one INSERT of one fact",
                           "soaks_together": args.together}
    soaks = [(kind, fn, n) for kind, fn, n in (("python", python_soak, args.python_sessions),
                                               ("http", http_soak, args.http_sessions)) if n]
    lock = threading.Lock()

    def progress(kind: str, so_far: dict[str, Any]) -> None:
        """The results so far, saved after every session: a run stopped early keeps what it measured."""
        with lock:
            out[kind] = so_far
            out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
            save_results(args.name, out)

    with ThreadPoolExecutor(max_workers=2 if args.together else 1) as pool:  # one worker: one after the other
        futures = {kind: pool.submit(fn, args.vindex, n, progress) for kind, fn, n in soaks}
        results = {kind: fut.result() for kind, fut in futures.items()}
    with lock:
        out |= results
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print("| process | sessions | RssAnon at start | after the first | last | MB / session after the first |\n"
          "|---|---:|---:|---:|---:|---:|")
    for kind in ("python", "http"):
        if kind in out:
            s = out[kind]
            print(f"| {kind} | {s['sessions']} | {s['start_mb']:.0f} MB | {s['after_first_mb']:.0f} MB | "
                  f"{s['last_mb']:.0f} MB | {s['mb_per_session_after_first']:+.2f} |")
    print(f"\nwrote {save_results(args.name, out)}")


if __name__ == "__main__":
    main()
