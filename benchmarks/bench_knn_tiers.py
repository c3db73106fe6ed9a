"""The gate KNN's exact top-k (knn.top_abs: the bounded int8 pass, then exact rescoring) on each CPU
tier, on one machine, at two layer shapes.

    python benchmarks/bench_knn_tiers.py [--rounds 20] [--tiers avx512vnni,avx2,float32-avx2]

Tiers as bench_topk_tiers.py builds them (each in its own process and numba cache): this CPU as it
is; numba built for haswell (AVX2: the int8 x int16 pass with vpmaddwd); the same build on the float32
tier (the int8 x float32 pass). Shapes: Gemma 3 270M's gates (2,048 x 640) and a Gemma 3 4B layer's
(10,240 x 2,560), random f16 rows, k = 10, queries with a few outlier dimensions as real residuals
have. Per shape: the median wall and CPU milliseconds of a query over --rounds after a compiling call,
the rows rescored, and whether the ids equal brute force's. The load average is recorded with every
figure. Writes benchmarks/results/knn-tiers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_topk_tiers import TIERS
from results_file import save_results

HERE = Path(__file__).resolve().parent.parent
SHAPES = {"gemma3-270m layer": (2048, 640), "gemma3-4b layer": (10240, 2560)}

KERNEL = """
import json, os, statistics, sys, time
import numpy as np
from larql.quant import isa
from larql.vindex import knn
rounds, out = int(sys.argv[1]), {"isa": isa.TIER, "shapes": {}}
for name, (n, h) in json.loads(sys.argv[2]).items():
    rng = np.random.default_rng(n)
    gates = (rng.standard_normal((n, h)) * 0.05).astype(np.float16)
    index = knn.build_int8(gates)
    qs = []
    for _ in range(rounds + 1):
        q = rng.standard_normal(h).astype(np.float32)
        q[rng.integers(0, h, 3)] *= 100.0
        qs.append(q)
    knn.top_abs(gates, index, qs[0], 10)  # compiles
    wall, cpu, rescored, exact, load = [], [], [], True, []
    g64 = gates.astype(np.float64)
    for q in qs[1:]:
        load.append(os.getloadavg()[0])
        t, c = time.perf_counter(), time.process_time()
        ids, scores = knn.top_abs(gates, index, q, 10)
        wall.append(1e3 * (time.perf_counter() - t))
        cpu.append(1e3 * (time.process_time() - c))
        rescored.append(len(ids))
        got = sorted(int(ids[i]) for i in np.argsort(-np.abs(scores))[:10])
        want = sorted(int(i) for i in np.argsort(-np.abs(g64 @ q.astype(np.float64)))[:10])
        exact = exact and got == want
    out["shapes"][name] = {"rows": n, "width": h, "median_wall_ms": statistics.median(wall),
                           "median_cpu_ms": statistics.median(cpu), "median_rescored": statistics.median(rescored),
                           "same_ids_as_brute_force": exact, "load_before": load}
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="timed queries per shape and tier")
    parser.add_argument("--tiers", default=",".join(TIERS), help="which of: " + ", ".join(TIERS))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from larql.cli.benchmark import machine

    tmp = Path(tempfile.mkdtemp())
    out: dict[str, object] = {"machine": machine(), "k": 10, "tiers": {}}
    for name in args.tiers.split(","):
        env = dict(os.environ, **TIERS[name], PYTHONPATH=str(HERE), NUMBA_CACHE_DIR=str(tmp / f"numba-{name}"))
        done = subprocess.run([sys.executable, "-c", KERNEL, str(args.rounds), json.dumps(SHAPES)], env=env,
                              check=True, capture_output=True, text=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        out["tiers"][name] = {"env": TIERS[name], **row}  # type: ignore[index]
        print(name, json.dumps(row["shapes"]), flush=True)
    out["load_average_end"] = list(os.getloadavg())
    print(f"wrote {save_results('knn-tiers', out)}")


if __name__ == "__main__":
    main()
