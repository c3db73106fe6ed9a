"""How far a cheaper first pass could rule tokens out of down_meta's top-k, on Gemma 3 270M's own
data: what a rigorous pre-screen would have to beat before the int8 pass.

    python benchmarks/bench_topk_prescreen.py [--layers 0,9,17] [--features 48] [--k 10]

Per layer, for a sample of features w (rows of W_down^T) against the whole unembedding U:
    threshold          the k-th score over ||u|| ||w|| (quantiles), and over the scores' spread
    bound width c      tokens an approximate pass with |A - u.w| <= c ||u|| ||w|| leaves to rescore
                       (those with u.w + 2 c ||u|| ||w|| >= the k-th score), per feature
    principal axes     pairs ruled out by the top r of U's principal axes exactly plus Cauchy-Schwarz
                       on the rest (|u_rest . w_rest| <= ||u_rest|| ||w_rest||), and the energy they hold
Writes benchmarks/results/topk-prescreen.json with the CPU, its tier and the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from results_file import save_results

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="0,9,17")
    parser.add_argument("--features", type=int, default=48)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    from larql.cli.benchmark import machine
    from larql.model.load import load

    out: dict[str, object] = {"machine": machine(), "k": args.k, "layers": {}}
    w = load("gemma3-270m").weights
    u = w.output.dequantize()
    un = np.linalg.norm(u, axis=1)
    ev, axes = np.linalg.eigh(u.astype(np.float64).T @ u.astype(np.float64))
    ev, axes = ev[::-1], axes[:, ::-1].astype(np.float32)
    ur = u @ axes
    ranks = (32, 64, 128, 256)
    out["energy_in_top_axes"] = {r: float(ev[:r].sum() / ev.sum()) for r in ranks}
    rng = np.random.default_rng(0)
    for layer in (int(x) for x in args.layers.split(",")):
        wt = w.layers[layer].down.dequantize().T
        wt = np.ascontiguousarray(wt[rng.choice(len(wt), args.features, replace=False)])
        wn = np.linalg.norm(wt, axis=1)
        s = wt @ u.T
        kth = -np.sort(-s, axis=1)[:, args.k - 1]
        scale = wn[:, None] * un[None, :]
        row: dict[str, object] = {
            "kth_over_norms_quantiles": np.quantile(kth / (wn * un.max()), [0, 0.5, 1]).tolist(),
            "kth_over_std_quantiles": np.quantile(kth / s.std(axis=1), [0, 0.5, 1]).tolist(),
            "rescored_per_feature_median": {c: float(np.median((s + 2 * c * scale >= kth[:, None]).sum(axis=1)))
                                            for c in (0.005, 0.01, 0.02, 0.04, 0.08)},
        }
        wr = wt @ axes
        row["ruled_out_by_top_axes"] = {
            r: float(np.mean(wr[:, :r] @ ur[:, :r].T + np.linalg.norm(wr[:, r:], axis=1)[:, None]
                             * np.linalg.norm(ur[:, r:], axis=1)[None, :] < kth[:, None])) for r in ranks}
        out["layers"][str(layer)] = row  # type: ignore[index]
        print(layer, row, flush=True)
    out["load_after"] = os.getloadavg()
    print(f"wrote {save_results('topk-prescreen', out)}")


if __name__ == "__main__":
    main()
