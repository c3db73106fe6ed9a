"""An edit's candidate tokens (QuantMatrix.top_k: the k likeliest of Gemma 3's 262,144 tokens for each
scored row) on each CPU tier, on one machine.

    python benchmarks/bench_edit_topk_tiers.py [--rounds 5] [--rows 256] [--k 256] [--tiers avx512vnni,avx2,float32-avx2]

Tiers as bench_topk_tiers.py builds them (each in its own process and numba cache): this CPU as it
is (the int8 pass on the tiled copy with vpdpbusd); numba built for haswell (the same pass with
vpmaddubsw + vpmaddwd, the same scores); the same build on the float32 tier (float32 chunks of the
unembedding). Rows: gemma3-270m's final residuals of ordinary text, `--rows` at a time, computed once
here and given to every tier. Per tier: the
median wall and CPU seconds of a call over --rounds after a first call (which compiles and makes
the tiled copy), and whether the ids equal the first tier's (the int8 tiers rank by exact float64
scores and agree; float32 chunks may order two scores within ~1e-6 the other way). The load average is recorded with
every figure. Writes benchmarks/results/edit-topk-tiers.json.
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
TEXT = ("The history of the city begins with a small settlement on the river, where traders met to exchange "
        "salt, furs and grain; by the twelfth century it had walls, a market charter and a bishop. ") * 8

KERNEL = """
import hashlib, json, os, statistics, sys, time
import numpy as np
import larql
from larql.quant import isa
rounds, k = int(sys.argv[1]), int(sys.argv[3])
x = np.load(sys.argv[2])  # the same rows for every tier (each build's forward pass rounds its own way)
w = larql.load("gemma3-270m").weights.output
first = w.top_k(x, k)
wall, cpu, load = [], [], []
for _ in range(rounds):
    load.append(os.getloadavg()[0])
    t, c = time.perf_counter(), time.process_time()
    got = w.top_k(x, k)
    wall.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
print(json.dumps({"isa": isa.TIER, "matrix": [w.name, w.qtype.name, w.n_rows, w.n_cols], "rows": len(x), "k": k,
                  "median_wall_s": statistics.median(wall), "median_cpu_s": statistics.median(cpu), "wall_s": wall,
                  "cpu_s": cpu, "ids_sha256": hashlib.sha256(got.tobytes()).hexdigest(), "load_before": load}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=256, help="scored rows per call (128 or more: the tiled copy is made)")
    parser.add_argument("--k", type=int, default=256)
    parser.add_argument("--tiers", default=",".join(TIERS), help="which of: " + ", ".join(TIERS))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from larql.cli.benchmark import machine

    tmp = Path(tempfile.mkdtemp())
    import numpy as np

    import larql

    m = larql.load("gemma3-270m")
    ids = m.tokenize(TEXT)[: args.rows + 1]
    x = m.run_with_cache(ids, names=["hook_final_norm"])[1]["hook_final_norm"][1:]  # (rows, hidden)
    rows = tmp / "rows.npy"
    np.save(rows, np.ascontiguousarray(x, dtype=np.float32))
    out: dict[str, object] = {"machine": machine(), "rows": len(x), "tiers": {}}
    for name in args.tiers.split(","):
        env = dict(os.environ, **TIERS[name], PYTHONPATH=str(HERE), NUMBA_CACHE_DIR=str(tmp / f"numba-{name}"))
        done = subprocess.run([sys.executable, "-c", KERNEL, str(args.rounds), str(rows), str(args.k)], env=env,
                              check=True, capture_output=True, text=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        out["tiers"][name] = {"env": TIERS[name], **row}  # type: ignore[index]
        print(name, {k: row[k] for k in ("isa", "median_wall_s", "median_cpu_s", "ids_sha256")}, flush=True)
    tiers = list(out["tiers"].values())  # type: ignore[attr-defined]
    for t in tiers:  # the int8 tiers rank by exact scores: the same ids; float32 may swap near-ties
        t["same_ids_as_first_tier"] = t["ids_sha256"] == tiers[0]["ids_sha256"]
    out["load_average_end"] = list(os.getloadavg())
    print(f"wrote {save_results('edit-topk-tiers', out)}")


if __name__ == "__main__":
    main()
