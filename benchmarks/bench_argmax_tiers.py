"""Greedy decode's lm_head argmax on gemma3-270m per CPU tier: the float32 matvec against the tiled
int8 candidate pass, paired in each process (VNNI as this CPU is, LARQL_ISA=avx2 on it, and numba
built for haswell: see bench_topk_tiers.py). Milliseconds a call (median of --rounds over 8
activations), the load average beside each round.

    python benchmarks/bench_argmax_tiers.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_topk_tiers import AVX2_BUILD, HERE
from results_file import save_results

TIERS = {"avx512vnni": {}, "avx2-on-vnni": {"LARQL_ISA": "avx2"}, "avx2": AVX2_BUILD}

CODE = """
import json, os, statistics, sys, time
import numpy as np
import larql
from larql.quant import argmax, argmax_tiles, isa
out = larql.load("gemma3-270m").weights.output
norms = argmax.row_norms(out.raw)
tiled = argmax_tiles.Tiled(out.raw, norms)
rng = np.random.default_rng(0)
xs = [(rng.standard_normal(out.n_cols) * 2).astype(np.float32) for _ in range(8)]
fns = {"float32": lambda x: argmax.argmax_q8_0(out.raw, None, x),
       "int8_tiled": lambda x: argmax.argmax_q8_0(out.raw, norms, x, tiled)}
for x in xs:
    assert fns["float32"](x) == fns["int8_tiled"](x)
res, load = {k: [] for k in fns}, []
for _ in range(int(sys.argv[1])):
    load.append(os.getloadavg()[0])
    for k, f in fns.items():
        t = time.perf_counter()
        for x in xs:
            f(x)
        res[k].append((time.perf_counter() - t) / len(xs) * 1e3)
print(json.dumps({"isa": isa.TIER, "ms": res, "median_ms": {k: statistics.median(v) for k, v in res.items()},
                  "load_before": load}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from larql.cli.benchmark import machine

    tmp = Path(tempfile.mkdtemp())
    out: dict[str, object] = {"machine": machine(), "tiers": {}}
    for name, env in TIERS.items():
        full = dict(os.environ, **env, PYTHONPATH=str(HERE), NUMBA_CACHE_DIR=str(tmp / f"numba-{name}"))
        done = subprocess.run([sys.executable, "-c", CODE, str(args.rounds)], env=full, check=True,
                              capture_output=True, text=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        out["tiers"][name] = {"env": env, **row}  # type: ignore[index]
        print(name, row["median_ms"], row["load_before"], flush=True)
    print("wrote", save_results("argmax-tiers", out))


if __name__ == "__main__":
    main()
