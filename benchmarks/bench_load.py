"""larql on a busy machine: decode, prefill and DESCRIBE beside a CPU hog, with the thread settings
of the libraries' defaults ("old") and with larql.threads.configure()
("new": OpenMP workers spin ~0.1 ms before they sleep, one BLAS thread when the machine is busy at
start, numba on every available core; "new-passive": the same with OpenMP's passive wait instead of the
spin); with --settings also each part alone ("passive", "blas1").

    python benchmarks/bench_load.py --vindex g.vindex [--hogs 2] [--decode 24] [--settings old,new,new-passive,passive,blas1]

Each measurement runs in a fresh process (thread pools read their settings once, at start), on a
quiet machine and then beside `--hogs` busy-looping processes. Prints a table and writes
benchmarks/results/load.json. Numbers on a shared VM move between runs; run it twice.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from results_file import save_results

# every variable either setting touches: cleared first, so "old" is the libraries' own defaults
THREAD_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "LARQL_THREADS")
PROMPT = ("The history of the city begins with a small settlement on the river, where traders from the north and "
          "the south met to exchange salt, grain, wool and news. ") * 6


def worker(vindex: str | None, n_decode: int) -> dict[str, float]:
    """Runs in its own process, under the environment of one setting: its measurements."""
    import numpy as np

    import larql

    m = larql.load("gemma3-270m")
    ids = m.tokenize(PROMPT)
    m.next_logits(ids[:8])  # numba kernels compiled / loaded from cache outside the timings
    t0 = time.perf_counter()
    m.next_logits(ids)
    prefill = len(ids) / (time.perf_counter() - t0)
    cache = m.new_cache(len(ids) + n_decode)
    logits = m.next_logits(ids, cache)
    t0 = time.perf_counter()
    for _ in range(n_decode):
        logits = m.next_logits([int(np.argmax(logits))], cache)
    out = {"prefill_tok_s": prefill, "decode_tok_s": n_decode / (time.perf_counter() - t0)}
    if vindex:
        from larql.lql.executor import execute

        execute(f'USE "{vindex}"')  # open and verify outside the timing
        t0 = time.perf_counter()
        execute(f'USE "{vindex}"; DESCRIBE "France"')
        out["describe_s"] = time.perf_counter() - t0
    return out


def setting_env(setting: str) -> dict[str, str]:
    """The environment of a setting: old (the libraries' defaults), new (larql.threads.configure,
    what the CLI applies: a short OpenMP spin), new-passive (configure with the
    passive OpenMP wait instead of the spin), or one of its parts alone: passive
    (OMP_WAIT_POLICY), blas1 (one BLAS thread)."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    if setting in ("new", "new-passive"):
        from larql.threads import configure

        if setting == "new-passive":
            env["OMP_WAIT_POLICY"] = "PASSIVE"  # configure keeps a policy that is set
        configure(env=env)
    elif setting == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif setting == "blas1":
        env.update({"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    return env


def measure(setting: str, vindex: str | None, n_decode: int) -> dict[str, float]:
    env = setting_env(setting)
    r = subprocess.run([sys.executable, __file__, "--worker", "--decode", str(n_decode)]
                       + (["--vindex", vindex] if vindex else []), env=env, capture_output=True, text=True,
                       timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"worker {setting} failed:\n{r.stderr}")
    return json.loads(r.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vindex", help="an inference-level gemma3-270m vindex, for the DESCRIBE timing")
    ap.add_argument("--hogs", type=int, default=2, help="busy-looping processes beside larql (default 2)")
    ap.add_argument("--decode", type=int, default=24)
    ap.add_argument("--settings", default="old,new", help="any of old, new, new-passive, passive, blas1 (comma-separated)")
    ap.add_argument("--loads", default="quiet,loaded", help="quiet, loaded or both")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.vindex, args.decode)))
        return
    rows: dict[str, dict[str, float]] = {}
    for load in args.loads.split(","):
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs if load == "loaded" else 0)]
        try:
            time.sleep(1.0 if hogs else 0.0)
            for setting in args.settings.split(","):
                rows[f"{load}/{setting}"] = measure(setting, args.vindex, args.decode)
                print(load, setting, {k: round(v, 2) for k, v in rows[f"{load}/{setting}"].items()}, flush=True)
        finally:
            for h in hogs:  # only the processes this script started
                h.kill()
                h.wait()
    print("\n| machine load | settings | prefill tok/s | decode tok/s | DESCRIBE s |\n|---|---|---:|---:|---:|")
    for key, r in rows.items():
        load, setting = key.split("/")
        print(f"| {load}{f' + {args.hogs} busy processes' if load == 'loaded' else ''} | {setting} | "
              f"{r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.1f} | {r.get('describe_s', float('nan')):.1f} |")
    save_results("load", {"hogs": args.hogs, "cores": os.cpu_count(), "loadavg_at_end": os.getloadavg(),
                          "rows": rows, "settings": {k: {v: e.get(v) for v in THREAD_VARS if e.get(v)}
                                                     for k in args.settings.split(",") for e in [setting_env(k)]}})


if __name__ == "__main__":
    main()
