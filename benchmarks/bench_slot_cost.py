"""What METHOD NEURON's recycled features cost on their own: delete the N cheapest features
(by rms activation x |down column|, the slots a batch of N neurons a layer took before neurons were added) of each
given layer — no neurons installed — and measure the unrelated prompts (top-1 kept, mean KL), each
layer alone and all together; optionally with the deleted features compensated by least squares
from the kept ones over the statistics corpus (down_D C_DK C_KK⁻¹, one weight op a layer).

    python benchmarks/bench_slot_cost.py --vindex g.vindex [--layers 3,4,5,6,7,8] [--n 167] [--compensate]

Writes benchmarks/results/slot-cost[-NAME].json with the machine's description.
"""

from __future__ import annotations

import argparse
import os
import platform

import larql.threads

larql.threads.configure()  # before numpy starts OpenBLAS, whose pool sizes itself once: one thread on a busy machine

import numpy as np  # noqa: E402
from results_file import save_results  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vindex", required=True)
    parser.add_argument("--layers", default="3,4,5,6,7,8")
    parser.add_argument("--n", type=int, default=167, help="features deleted a layer")
    parser.add_argument("--compensate", action="store_true")
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    from larql.edit.measure.evaluate import unrelated_logps
    from larql.edit.methods.metrics import key_metrics, stats_dir
    from larql.edit.methods.weight_edit import dense_layers
    from larql.edit.patches.patch import PatchOp
    from larql.edit.patches.weight_op import WeightOp
    from larql.edit.state.view import edit_vindex
    from larql.model.interp import kl

    v = edit_vindex(args.vindex)
    m = v.model()
    before = unrelated_logps(m)
    layers = [int(x) for x in args.layers.split(",")]

    def ops_for(layer: int) -> list:
        metric = key_metrics(m, [layer], stats_dir(v))[layer]
        down = dense_layers(m)(layer, m.edits).down  # (hidden, ffn)
        # the slots METHOD NEURON took before it added features: the cheapest on ordinary text,
        # rms activation x norm of the down column
        costs = np.sqrt(np.maximum(metric.diag, 0.0)) * np.linalg.norm(down, axis=0)
        gone = np.argsort(costs, kind="stable")[: args.n]
        ops: list = [PatchOp("delete", layer, int(f)) for f in gone]
        if args.compensate:
            cov = np.asarray(metric.cov, np.float64)
            kept = np.setdiff1d(np.arange(len(cov)), gone)
            c_kk = cov[np.ix_(kept, kept)] + 1e-6 * float(np.mean(np.diag(cov))) * np.eye(len(kept))
            v_mat = np.zeros((len(cov), len(gone)))
            v_mat[kept] = np.linalg.solve(c_kk, cov[np.ix_(kept, gone)])  # kept activations -> deleted ones
            u = down[:, gone].astype(np.float32)
            ops.append(WeightOp(layer, u, v_mat.astype(np.float32), v_mat.astype(np.float32), (), "compensation"))
        return ops

    def measure(ops: list) -> dict:
        start = len(v.patches.pending)
        v.patches.record_all(ops)
        after = unrelated_logps(m)
        v.patches.undo(len(v.patches.pending) - start)
        kept = sum(int(np.argmax(b) == np.argmax(a)) for b, a in zip(before, after))
        return {"kept": kept, "of": len(after), "kl": float(np.mean([kl(b, a) for b, a in zip(before, after)]))}

    rows = {str(layer): measure(ops_for(layer)) for layer in layers}
    rows["all"] = measure([op for layer in layers for op in ops_for(layer)])
    out = {"model": v.index["model"], "n": args.n, "compensate": args.compensate, "rows": rows,
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg()}}
    save_results("slot-cost" + (f"-{args.name}" if args.name else ""), out)
    print(f"| layers | unrelated top-1 kept | KL |  ({args.n} cheapest features deleted a layer"
          + (", compensated)" if args.compensate else ")"))
    print("|---|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['kept']} / {r['of']} | {r['kl']:.3f} |")


if __name__ == "__main__":
    main()
