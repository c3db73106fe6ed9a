"""down_meta's approximate pass and browse extraction of gemma3-270m on each CPU tier, on one machine.

    python benchmarks/bench_topk_tiers.py [--rounds 3] [--extract-runs 2] [--tiers avx512vnni,avx2,float32-avx2]
                                          [--old /path/to/other/checkout] [--name tiers]

Each tier runs in its own process with its own numba cache directory:
    avx512vnni     this CPU as it is (when it has AVX-512 VNNI)
    avx2           numba built for haswell (NUMBA_CPU_NAME plus NUMBA_CPU_FEATURES: the name alone keeps
                   this CPU's features) and OpenBLAS's Haswell kernels (OPENBLAS_CORETYPE)
    float32-avx2   the same build with LARQL_ISA=float32: the float32 sgemm pass, the AVX2 int8
                   kernel's peer
The kernel figure is topk.top_tokens on a quarter of a Gemma 3 layer (2,048 features x 65,536
random tokens x 640), the median of --rounds after a compiling call, wall and CPU seconds (CPU
seconds mean more on a busy machine); beside it the same on Gemma 3 270M's own data (layer 9's
first 512 features against its 262,144-token Q8_0 unembedding, the same work) on one thread, so
its CPU seconds are work, not numba's threads waiting for each other. Extraction: stage seconds from its progress reports, with
topk.prepare and topk.top_tokens timed apart; the first run compiles and is reported apart; the
sha256 of each tier's down_meta.bin (all must be equal). With --old, the same runs from another
checkout (the code before a change), taking turns with this one run by run, so both see the same
machine; its down_meta.bin must be the same bytes too. Each extraction records its CPU seconds
beside the wall ones (on a busy machine the fairer figure). The load average is recorded with every
figure. Writes benchmarks/results/NAME.json (default tiers: the file the performance guide renders).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from results_file import save_results

HERE = Path(__file__).resolve().parent.parent
# haswell's features as LLVM names them: AVX2, FMA, F16C, BMI, no AVX-512
HASWELL = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,+fsgsbase,+fxsr,+lzcnt,+mmx,+movbe,+pclmul,"
           "+popcnt,+rdrnd,+sahf,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+x87,+xsave,+xsaveopt")
AVX2_BUILD = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": HASWELL, "OPENBLAS_CORETYPE": "Haswell"}
TIERS = {"avx512vnni": {}, "avx2": AVX2_BUILD, "float32-avx2": {**AVX2_BUILD, "LARQL_ISA": "float32"}}

# the timed rounds of a kernel child: `top_tokens(tok, wt, 10)` after the setup, `EXTRA` added to its JSON line
TIMED = """
wall, cpu, load = [], [], []
for _ in range(int(sys.argv[1])):
    load.append(os.getloadavg()[0])
    t, c = time.perf_counter(), time.process_time()
    topk.top_tokens(tok, wt, 10)
    wall.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
print(json.dumps({"isa": isa.TIER, **EXTRA, "wall_s": wall, "cpu_s": cpu, "median_wall_s": statistics.median(wall),
                  "median_cpu_s": statistics.median(cpu), "load_before": load}))
"""

KERNEL = """
import json, os, statistics, sys, time
import numpy as np
from larql.quant import isa
from larql.vindex import topk
rng = np.random.default_rng(0)
u = rng.standard_normal((65536, 640)).astype(np.float32)
wt = (rng.standard_normal((2048, 640)) * 0.05).astype(np.float32)
tok = topk.prepare(u)
topk.top_tokens(tok, wt[:64], 10)
EXTRA = {}
""" + TIMED

REAL_KERNEL = """
import json, os, statistics, sys, time
from larql.model.load import load as load_model
from larql.quant import isa
from larql.vindex import topk
w = load_model("gemma3-270m").weights
tok = topk.prepare(w.output.dequantize())
wt = w.layers[9].down.dequantize().T[:512].copy()
topk.top_tokens(tok, wt[:16], 10)
EXTRA = {"threads": 1}
""" + TIMED
ONE_THREAD = {"NUMBA_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}  # CPU seconds are work, not waiting

EXTRACT = """
import json, os, sys, time
from larql.quant import isa
from larql.vindex import topk
from larql.vindex.extract import extract
stages, parts, last = {}, {"topk.prepare": 0.0, "topk.top_tokens": 0.0}, [time.perf_counter(), None]
def timed(name, fn):
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            parts[name] += time.perf_counter() - t
    return run
topk.prepare = timed("topk.prepare", topk.prepare)
topk.top_tokens = timed("topk.top_tokens", topk.top_tokens)
def progress(stage, done, total):
    now = time.perf_counter()
    if last[1] is not None:
        stages[last[1]] = stages.get(last[1], 0.0) + now - last[0]
    last[0], last[1] = now, stage
load = os.getloadavg()[0]
t0, c0 = time.perf_counter(), time.process_time()
extract("gemma3-270m", sys.argv[1], level="browse", overwrite=True, progress=progress)
progress(None, 0, 0)
print(json.dumps({"isa": isa.TIER, "total_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "stages_s": stages, **parts, "load_before": load, "load_after": os.getloadavg()[0]}))
"""


def child(code: str, args: list[str], env: dict[str, str], cache: Path, tree: Path = HERE) -> dict[str, object]:
    full = dict(os.environ, **env, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=str(cache), PYTHONDONTWRITEBYTECODE="1")
    # cwd: `python -c` puts the working directory first on sys.path, before PYTHONPATH's tree
    done = subprocess.run([sys.executable, "-c", code, *args], env=full, cwd=tree, check=True, capture_output=True,
                          text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def down_meta_hash(vindex: Path) -> str:
    """down_meta.bin's sha256: every tier must write the same bytes."""
    import hashlib

    return hashlib.sha256((vindex / "down_meta.bin").read_bytes()).hexdigest()


def tier_rows(name: str, trees: dict[str, Path], rounds: int, extract_runs: int) -> dict[str, dict[str, object]]:
    """One tier from each checkout (key -> tree): the kernel's rounds, then the extractions (the first
    compiles), the checkouts taking turns run by run so that a change in the machine's load falls on
    both alike."""
    env = TIERS[name]
    tmp = {key: Path(tempfile.mkdtemp()) for key in trees}
    rows: dict[str, dict[str, object]] = {}
    for key, tree in trees.items():
        rows[key] = {"env": env, "tree": str(tree),
                     "kernel": child(KERNEL, [str(rounds)], env, tmp[key] / "numba", tree),
                     "kernel_real": child(REAL_KERNEL, [str(rounds)], {**env, **ONE_THREAD}, tmp[key] / "numba", tree),
                     "extract": []}
        print(name, key, "kernel", rows[key]["kernel"], rows[key]["kernel_real"], flush=True)
    for run in range(extract_runs + 1):
        for key, tree in trees.items():
            done = child(EXTRACT, [str(tmp[key] / "g.vindex")], env, tmp[key] / "numba", tree)
            print(name, key, "extract", "(compiles)" if run == 0 else "", done, flush=True)
            if run == 0:
                rows[key]["extract_first_run"] = done
            else:
                rows[key]["extract"].append(done)  # type: ignore[attr-defined]
    for key in trees:
        rows[key]["down_meta_sha256"] = down_meta_hash(tmp[key] / "g.vindex")
        shutil.rmtree(tmp[key], ignore_errors=True)  # a browse vindex and a numba cache: ~400 MB
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed kernel calls per tier")
    parser.add_argument("--extract-runs", type=int, default=2, help="timed extractions per tier, after the first")
    parser.add_argument("--tiers", default=",".join(TIERS), help="which of: " + ", ".join(TIERS))
    parser.add_argument("--old", type=Path, help="another checkout to run the same way, taking turns with this one")
    parser.add_argument("--name", default="tiers", help="the results file's name")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from larql.cli.benchmark import machine

    trees = {"tiers": HERE, **({"old": args.old.resolve()} if args.old else {})}
    out: dict[str, dict[str, object]] = {key: {} for key in trees}
    for name in args.tiers.split(","):
        for key, row in tier_rows(name, trees, args.rounds, args.extract_runs).items():
            out[key][name] = row
    path = save_results(args.name, {"machine": machine(), **out})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
