"""down_meta's approximate pass and browse extraction of gemma3-270m on each CPU tier, on one machine.

    python benchmarks/bench_topk_tiers.py [--rounds 3] [--extract-runs 2] [--tiers avx512vnni,avx2,float32-avx2]
                                          [--old /path/to/other/checkout] [--name tiers-DATE]

Each tier runs in its own process with its own numba cache directory:
    avx512vnni     this CPU as it is (when it has AVX-512 VNNI)
    avx2           numba built for haswell (NUMBA_CPU_NAME plus NUMBA_CPU_FEATURES: the name alone keeps
                   this CPU's features) and OpenBLAS's Haswell kernels (OPENBLAS_CORETYPE)
    float32-avx2   the same build with LARQL_ISA=float32: the float32 sgemm pass, the AVX2 int8
                   kernel's peer
The kernel figure is topk.top_tokens on a quarter of a Gemma 3 layer (2,048 features x 65,536
random tokens x 640), the median of --rounds after a compiling call, wall and CPU seconds (CPU
seconds mean more on a busy machine). Extraction: stage seconds from its progress reports, with
topk.prepare and topk.top_tokens timed apart; the first run compiles and is reported apart; the
sha256 of each tier's down_meta.bin (all must be equal). With --old, the same runs from another
checkout (the code before a change), each tier's old run just before its new one, so both see the
same machine; its down_meta.bin must be the same bytes too. The load average is recorded with every
figure. Writes benchmarks/results/NAME.json (default tiers-DATE).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
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
wall, cpu, load = [], [], []
for _ in range(int(sys.argv[1])):
    load.append(os.getloadavg()[0])
    t, c = time.perf_counter(), time.process_time()
    topk.top_tokens(tok, wt, 10)
    wall.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
print(json.dumps({"isa": isa.TIER, "wall_s": wall, "cpu_s": cpu, "median_wall_s": statistics.median(wall),
                  "median_cpu_s": statistics.median(cpu), "load_before": load}))
"""

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
t0 = time.perf_counter()
extract("gemma3-270m", sys.argv[1], level="browse", overwrite=True, progress=progress)
progress(None, 0, 0)
print(json.dumps({"isa": isa.TIER, "total_s": time.perf_counter() - t0, "stages_s": stages, **parts,
                  "load_before": load, "load_after": os.getloadavg()[0]}))
"""


def child(code: str, args: list[str], env: dict[str, str], cache: Path, tree: Path = HERE) -> dict[str, object]:
    full = dict(os.environ, **env, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=str(cache), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, "-c", code, *args], env=full, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def down_meta_hash(vindex: Path) -> str:
    """down_meta.bin's sha256: every tier must write the same bytes."""
    import hashlib

    return hashlib.sha256((vindex / "down_meta.bin").read_bytes()).hexdigest()


def tier_row(name: str, tree: Path, tmp: Path, rounds: int, extract_runs: int) -> dict[str, object]:
    """One tier from one checkout: the kernel's rounds, then the extractions (the first compiles)."""
    env, cache = TIERS[name], tmp / f"numba-{name}"
    row: dict[str, object] = {"env": env, "tree": str(tree), "kernel": child(KERNEL, [str(rounds)], env, cache, tree)}
    print(name, tree, "kernel", row["kernel"], flush=True)
    runs = []
    for run in range(extract_runs + 1):
        runs.append(child(EXTRACT, [str(tmp / f"{name}.vindex")], env, cache, tree))
        print(name, tree, "extract", "(compiles)" if run == 0 else "", runs[-1], flush=True)
    row["extract_first_run"], row["extract"] = runs[0], runs[1:]
    row["down_meta_sha256"] = down_meta_hash(tmp / f"{name}.vindex")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed kernel calls per tier")
    parser.add_argument("--extract-runs", type=int, default=2, help="timed extractions per tier, after the first")
    parser.add_argument("--tiers", default=",".join(TIERS), help="which of: " + ", ".join(TIERS))
    parser.add_argument("--old", type=Path, help="another checkout to run the same way, each tier just before this one")
    parser.add_argument("--name", default=f"tiers-{datetime.date.today().isoformat()}", help="the results file's name")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from larql.cli.benchmark import machine

    out: dict[str, object] = {"machine": machine(), "tiers": {}}
    if args.old:
        out["old"] = {}
    for name in args.tiers.split(","):
        if args.old:
            out["old"][name] = tier_row(name, args.old.resolve(), Path(tempfile.mkdtemp()), args.rounds,  # type: ignore[index]
                                        args.extract_runs)
        out["tiers"][name] = tier_row(name, HERE, Path(tempfile.mkdtemp()), args.rounds,  # type: ignore[index]
                                      args.extract_runs)
    path = save_results(args.name, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
