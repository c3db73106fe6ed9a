"""Cold start: whole-process times of `larql --help`, `larql lql --plan`, and the first
`larql run MODEL "..."` after a fresh install (empty numba and larql caches) against a warm one;
a first run's two compiling processes (`larql.model.prewarm`) against one; plus the LQL parser's
tables built afresh against loaded from the cache. CPU is the machine's over each run (its second
process's included): run it on a quiet machine.

    python benchmarks/bench_coldstart.py [--model gemma3-270m] [--runs 3]

Every figure is printed beside its peer measured in the same run (the interpreter starting and
exiting for the CLI, the warm run for the cold one), as the median of --runs fresh processes, taken in
turn. Prints a table and writes benchmarks/results/coldstart.json with the machine's description.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_file import save_results

from larql.cli.benchmark import machine

PROMPT = "The capital of France is"


def machine_cpu() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: user, nice, system)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:4]
    return sum(int(f) for f in fields) / os.sysconf("SC_CLK_TCK")


def wait_for_prewarm() -> None:
    """Wait for a detached `larql.model.prewarm` process (a first run's second compiler) to end: the
    next run must not overlap it."""
    while subprocess.run(["pgrep", "-f", "larql.model.prewarm"], capture_output=True).returncode == 0:
        time.sleep(0.05)


def wall(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one process run to completion. The CPU is the whole machine's
    over the run and any second compiling process it started (a first run's cost includes that
    process's), so it is meaningful on a quiet machine only: the load average is printed with it."""
    cpu0, t0 = machine_cpu(), time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, _ = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed")
    seconds = time.perf_counter() - t0
    wait_for_prewarm()
    return seconds, machine_cpu() - cpu0


def parser_tables(env: dict[str, str]) -> dict[str, float]:
    """ms to build the LQL parser's tables, and to load them from the cache, in fresh processes."""
    code = ("import time, larql.lql.parser as p\nt = time.perf_counter(); p.lark_parser()\n"
            "print((time.perf_counter() - t) * 1e3)")
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        for label in ("build_ms", "cached_ms"):  # the first process writes the cache the second reads
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               env={**env, "LARQL_CACHE": cache})
            out[label] = float(r.stdout)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    py = sys.executable
    base = dict(os.environ)
    root = Path(tempfile.mkdtemp(prefix="larql-cold-"))
    cold_env = {**base, "NUMBA_CACHE_DIR": str(root / "numba"), "LARQL_CACHE": str(root / "larql")}
    run = [py, "-m", "larql", "run", args.model, PROMPT]

    def fresh() -> None:  # as after `pip install`: nothing compiled, no tokenizer or parser cached
        shutil.rmtree(root / "numba", ignore_errors=True)
        shutil.rmtree(root / "larql", ignore_errors=True)

    alone = {**cold_env, "LARQL_PREWARM": "0"}  # one process compiles everything
    pairs = [  # (what, command, its peer, the peer's environment, prepare before each)
        ("larql --help", [py, "-m", "larql", "--help"], [py, "-c", "pass"], cold_env, None),
        ("larql lql --plan 'SHOW MODELS'", [py, "-m", "larql", "lql", "--plan", "SHOW MODELS"], [py, "-c", "pass"],
         cold_env, None),
        (f"first larql run {args.model} (fresh caches) vs warm", run, run, cold_env, fresh),
        (f"first larql run {args.model}: two compiling processes vs one (LARQL_PREWARM=0)", run, run, alone, fresh),
    ]
    rows = []
    for what, cmd, peer, peer_env, prepare in pairs:
        mine, theirs = [], []
        for _ in range(args.runs):  # in turn, so that drift in the machine's load hits both
            if prepare:
                prepare()
            mine.append(wall(cmd, cold_env))
            if prepare and peer_env is not cold_env:
                prepare()
            theirs.append(wall(peer, peer_env))
        m, t = statistics.median(w for w, _ in mine), statistics.median(w for w, _ in theirs)
        rows.append({"what": what, "wall_s": round(m, 3), "cpu_s": round(statistics.median(c for _, c in mine), 3),
                     "peer_wall_s": round(t, 3), "peer_cpu_s": round(statistics.median(c for _, c in theirs), 3),
                     "ratio": round(m / t, 2)})
        print(f"{what}: {m:.2f} s (peer {t:.2f} s)", file=sys.stderr)
    tables = parser_tables(base)
    shutil.rmtree(root, ignore_errors=True)
    print(f"\nmedian of {args.runs} fresh processes each; load average {os.getloadavg()[0]:.1f}")
    print("| command | wall | cpu | peer wall | peer cpu | wall / peer |\n|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['what']} | {r['wall_s']:.2f} s | {r['cpu_s']:.2f} s | {r['peer_wall_s']:.2f} s | "
              f"{r['peer_cpu_s']:.2f} s | {r['ratio']:.2f}x |")
    print(f"| LQL parser tables: built / loaded from the cache | {tables['build_ms']:.0f} ms | | "
          f"{tables['cached_ms']:.0f} ms | | {tables['build_ms'] / tables['cached_ms']:.0f}x |")
    out = save_results("coldstart", {"machine": machine(), "model": args.model, "runs": rows, "parser": tables})
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
