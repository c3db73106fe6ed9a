"""Decode's direct kernels (kquant_rows.py) over GGUF blocks, one variant against another, at a 4B Gemma 3's
shapes: in GB/s of GGUF bytes, streamed from memory on 1 and 2 threads (wall time) and on one per
CPU-second (process time: what other work on the machine inflates least), and from L2 on one per
CPU-second (the kernel's own pace, no memory in the way), beside a read-only pass over the same bytes.

    python benchmarks/bench_direct_kernels.py [--reps 5] [--types Q4_K,Q6_K] [--name direct-kernels] [--tier avx2]

Each variant's output is checked bit for bit against the first's. Writes benchmarks/results/NAME.json
with the CPU, tier and load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numba
import numpy as np
from bench_matvec import random_blocks
from bench_topk_tiers import AVX2_BUILD
from numba import njit, prange
from results_file import save_results

from larql.cli.benchmark import machine
from larql.quant import GGMLType, kquant_rows
from larql.quant.types import row_bytes

SHAPES = {"Q4_K": [(10240, 2560), (2560, 10240), (2048, 2560)], "Q6_K": [(2560, 10240), (1024, 2560), (262144, 2560)],
          "Q5_0": [(6912, 1152), (1024, 1152)], "Q4_0": [(6912, 1152)]}
STREAM_BYTES = 384 << 20


def variants(qtype: str) -> dict[str, Callable[..., None]]:
    """The kernels to compare for a type: 'now' is what decode runs, 'one' the one-row form it ran before."""
    out = {"now": kquant_rows.MATVEC[int(GGMLType[qtype])]}
    one = getattr(kquant_rows, f"matvec_{qtype.lower()}_one", None)
    if one is not None:
        out["one"] = one
    return out


@njit(parallel=True, cache=True)
def _read(w: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - numba
    """A read of every byte (a row's sum), split over numba's threads by rows."""
    for r in prange(w.shape[0]):
        t = np.uint32(0)
        for i in range(w.shape[1]):
            t += w[r, i]
        out[r] = t


def bench(qtype: str, rows: int, cols: int, reps: int, rng: np.random.Generator) -> dict[str, Any]:
    nbytes = rows * row_bytes(GGMLType[qtype], cols)
    copies = [random_blocks(GGMLType[qtype], rows, cols, rng) for _ in range(max(1, -(-STREAM_BYTES // nbytes)))]
    cached_rows = max(2, min(rows, (512 << 10) // row_bytes(GGMLType[qtype], cols)) // 2 * 2)
    small = copies[0][:cached_rows]
    x = rng.standard_normal(cols).astype(np.float32)
    x[::7] *= 30.0
    kernels = variants(qtype)
    outs = {}
    for name, k in kernels.items():
        out = np.empty(rows, np.float32)
        k(copies[0], x, out)
        outs[name] = out
    first = next(iter(outs.values()))
    row: dict[str, Any] = {"type": qtype, "shape": [rows, cols], "mb": round(nbytes / 1e6, 2),
                           "load_before": [round(v, 2) for v in os.getloadavg()],
                           "bit_exact": {n: bool(np.array_equal(o, first)) for n, o in outs.items()}}
    threads = numba.get_num_threads()
    out = np.empty(rows, np.float32)
    sums = np.empty(rows, np.uint32)
    _read(copies[0], sums)
    runs: dict[str, Callable[[], Any]] = {"read": lambda: [_read(c, sums) for c in copies]}
    for name, k in kernels.items():
        runs[name] = partial(_over, k, copies, x, out)
    for t in sorted({1, threads}):
        numba.set_num_threads(t)
        times = _interleaved(runs, reps, time.perf_counter)
        for name, s in times.items():
            row[f"{name}_{t}t_gb_s"] = round(nbytes * len(copies) / s / 1e9, 2)
    numba.set_num_threads(1)  # one thread's CPU time: what the machine's other work does not inflate
    for name, s in _interleaved(runs, reps, time.process_time).items():
        row[f"{name}_1t_gb_per_cpu_s"] = round(nbytes * len(copies) / s / 1e9, 2)
    cached: dict[str, Callable[[], Any]] = {name: partial(_over, k, [small] * 50, x, out) for name, k in kernels.items()}
    for name, s in _interleaved(cached, reps, time.process_time).items():
        row[f"{name}_cached_1t_gb_per_cpu_s"] = round(small.nbytes * 50 / s / 1e9, 2)
    numba.set_num_threads(threads)
    return row


def _over(kernel: Callable[..., None], mats: list[np.ndarray], x: np.ndarray, out: np.ndarray) -> None:
    for w in mats:
        kernel(w, x, out)


def _interleaved(runs: dict[str, Callable[[], Any]], reps: int, clock: Callable[[], float]) -> dict[str, float]:
    """Median seconds (of `clock`) of each run, the runs taken in turn reps times (other work on the
    machine slows each alike)."""
    times: dict[str, list[float]] = {n: [] for n in runs}
    for _ in range(reps):
        for name, fn in runs.items():
            t = clock()
            fn()
            times[name].append(clock() - t)
    return {n: statistics.median(ts) for n, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--name", default="direct-kernels")
    ap.add_argument("--tier", choices=("host", "avx2"), default="host")
    ap.add_argument("--numba-cache", default=None, help="numba's cache directory for the avx2 build (default: a new one)")
    args = ap.parse_args()
    if args.tier == "avx2" and os.environ.get("NUMBA_CPU_NAME") != "haswell":
        env = dict(os.environ, **AVX2_BUILD, NUMBA_CACHE_DIR=args.numba_cache
                   or tempfile.mkdtemp(prefix="numba-avx2-"))
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    rng = np.random.default_rng(0)
    rows = []
    for qtype in args.types.split(","):
        for r, c in SHAPES[qtype]:
            row = bench(qtype, r, c, args.reps, rng)
            rows.append(row)
            print(row, flush=True)
    print(save_results(args.name, {"machine": machine(), "shapes": rows,
                                   "load_average_end": [round(v, 2) for v in os.getloadavg()]}))


if __name__ == "__main__":
    main()
