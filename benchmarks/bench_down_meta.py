"""Browse extraction of gemma3-270m, this tree against another (the old code), and down_meta checked
layer by layer: the two runs' ids and values, and every value and every disagreement against a
float64 recomputation from the model's float32 matrices.

    python benchmarks/bench_down_meta.py --old /path/to/old/checkout [--runs 2] [--keep DIR] [--brute 0,17] [--level browse]

Runs alternate (old, new, old, new...), each in its own process with its own numba cache directory
(the first run of each compiles: reported apart); the load average is printed with each time, since
the timings mean little on a busy machine. Writes benchmarks/results/down_meta.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from results_file import save_results

HERE = Path(__file__).resolve().parent.parent
RUN = ("import sys, time; from larql.vindex.extract import extract; t = time.perf_counter(); "
       "extract('gemma3-270m', sys.argv[1], level=sys.argv[2], overwrite=True); print(time.perf_counter() - t)")


def extract_timed(tree: Path, out: Path, cache: Path, level: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=str(cache), PYTHONDONTWRITEBYTECODE="1")
    # cwd: `python -c` puts the working directory first on sys.path, before PYTHONPATH's tree
    done = subprocess.run([sys.executable, "-c", RUN, str(out), level], env=env, cwd=tree, check=True,
                          capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def down_meta(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(ids (features, k) uint32, values float32)] per layer, from index.json's offsets."""
    index = json.loads((path / "index.json").read_text())
    raw = (path / "down_meta.bin").read_bytes()
    k = index["down_top_k"]
    out = []
    for layer in index["layers"]:
        n, off = layer["num_features"], layer["down_meta_offset"]
        ids = np.frombuffer(raw, np.uint32, n * k, off).reshape(n, k)
        vals = np.frombuffer(raw, np.float32, n * k, off + 4 * n * k).reshape(n, k)
        out.append((ids, vals))
    return out


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in float32 units in the last place (same-sign finite values)."""
    ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def compare(old: Path, new: Path) -> list[dict[str, object]]:
    """Per layer: ids equal, value ulps old vs new, new == the float64 score rounded to float32, and
    for each feature whose id lists differ, whether the new list is the better one by float64."""
    sys.path.insert(0, str(HERE))
    from larql.model.load import load

    w = load("gemma3-270m").weights
    u = w.output.dequantize()
    rows = []
    for i, ((oi, ov), (ni, nv)) in enumerate(zip(down_meta(old), down_meta(new))):
        wt = w.layers[i].down.dequantize().T.astype(np.float64)  # (ffn, hidden)
        exact = np.einsum("fkh,fh->fk", u[ni].astype(np.float64), wt).astype(np.float32)
        differ = np.flatnonzero((oi != ni).any(axis=1))
        worse = 0
        for f in differ:  # the new list must score at least as high, position by position, in float64
            old_s = np.sort((u[oi[f]].astype(np.float64) @ wt[f]).astype(np.float32))[::-1]
            worse += int((np.sort(exact[f])[::-1] < old_s).any())
        same = oi == ni
        rows.append({"layer": i, "ids_equal": float(same.mean()), "features_differing": len(differ),
                     "new_lists_worse_by_float64": worse,
                     "max_ulps_old_vs_new": int(ulps(ov[same], nv[same]).max(initial=0)),
                     "values_equal_old_vs_new": float((ov[same] == nv[same]).mean()),
                     "new_equals_float64_rounded": bool((exact == nv).all())})
        print(rows[-1], flush=True)
    return rows


def brute_force(new: Path, layers: list[int]) -> list[dict[str, object]]:
    """Per listed layer, the float64 scores of every (feature, token) pair rounded to float32 and
    ranked by (value desc, id asc): the new down_meta must hold exactly their top k."""
    from larql.model.load import load

    w = load("gemma3-270m").weights
    u = w.output.dequantize()
    meta = down_meta(new)
    rows = []
    for i in layers:
        ids, vals = meta[i]
        k = ids.shape[1]
        wt = w.layers[i].down.dequantize().T.astype(np.float64)
        best_v = np.full((len(wt), k), -np.inf, np.float32)
        best_i = np.zeros((len(wt), k), np.int64)
        for a in range(0, len(u), 16384):
            s = (wt @ u[a:a + 16384].astype(np.float64).T).astype(np.float32)
            floor = np.partition(s, -k, axis=1)[:, -k]
            for f in range(len(wt)):
                c = np.flatnonzero(s[f] >= floor[f])  # every tie of the chunk's k-th value too
                v, t = np.concatenate([best_v[f], s[f, c]]), np.concatenate([best_i[f], a + c])
                order = np.lexsort((t, -v))[:k]
                best_v[f], best_i[f] = v[order], t[order]
        rows.append({"layer": i, "ids_equal_brute_force": bool((best_i == ids).all()),
                     "values_equal_brute_force": bool((best_v == vals).all())})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="a checkout of the code to compare with")
    parser.add_argument("--runs", type=int, default=2, help="timed runs of each, after the first")
    parser.add_argument("--keep", help="directory for the vindexes and numba caches (default: a temporary one)")
    parser.add_argument("--brute", default="0,17", help="layers checked against a float64 brute force (~30 s each)")
    parser.add_argument("--level", default="browse", help="browse or inference")
    parser.add_argument("--check-only", action="store_true", help="compare the vindexes already in --keep")
    args = parser.parse_args()
    tmp = Path(args.keep or tempfile.mkdtemp())
    trees = {"old": Path(args.old).resolve(), "new": HERE}
    times: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for run in range(0 if args.check_only else args.runs + 1):
        for name, tree in trees.items():
            load = os.getloadavg()[0]
            seconds = extract_timed(tree, tmp / f"{name}.vindex", tmp / f"numba-{name}", args.level)
            times[name].append({"s": seconds, "load_before": load, "load_after": os.getloadavg()[0]})
            print(f"{name} run {run}{' (compiles)' if run == 0 else ''}: {seconds:.1f} s, load {load:.2f}",
                  flush=True)
    layers = compare(tmp / "old.vindex", tmp / "new.vindex")
    brute = brute_force(tmp / "new.vindex", [int(x) for x in args.brute.split(",") if x])
    out = save_results("down_meta" if args.level == "browse" else f"down_meta-{args.level}",
                       {"level": args.level, "times": times, "layers": layers, "brute_force": brute})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
