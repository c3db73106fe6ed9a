"""Accuracy cost of running the FFN with only its top-k features per layer.

    python benchmarks/bench_sparse_ffn.py [--model gemma3-270m] [--vindex g.vindex]

Two selections: by |act(gate) * up| (a hook on mlp.hook_post), and, with --vindex, the walk FFN's
gate KNN (by |gate score|, `walk_model(vindex, top_k=k)`). For each k: top-1 agreement with the dense
model and mean KL(dense || sparse) over the 30 golden prompts. Writes benchmarks/results/sparse_ffn.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from results_file import save_results

PROMPTS = Path(__file__).resolve().parents[1] / "tests" / "golden" / "reference" / "prompts.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--vindex", help="an inference-level vindex of the same model: also measure the walk's gate KNN")
    args = parser.parse_args()
    import larql
    from larql.model.generate import log_softmax
    from larql.model.hooks import sparse_ffn

    m = larql.load(args.model)
    prompts = json.loads(PROMPTS.read_text())
    dense = [log_softmax(m.next_logits(m.tokenize(p))) for p in prompts]
    rows = []

    def measure(selection: str, k: int, next_logits) -> None:
        agree, kls = 0, []
        for p, d in zip(prompts, dense):
            s = log_softmax(next_logits(m.tokenize(p)))
            agree += int(np.argmax(s) == np.argmax(d))
            kls.append(float(np.sum(np.exp(d) * (d - s))))
        rows.append({"selection": selection, "k": k, "top1_agreement": agree / len(prompts), "mean_kl": float(np.mean(kls))})
        print(f"| {selection} | {k} | {agree}/{len(prompts)} | {np.mean(kls):.3f} |")

    print(f"| selection | k (of {m.config.ffn}) | top-1 agreement | mean KL(dense || sparse) |\n|---|---:|---:|---:|")
    for k in (32, 128, 256, 512, 1024):
        spec = sparse_ffn(m.config.n_layers, k)
        measure("|act|", k, lambda ids, spec=spec: m.next_logits(ids, hooks=spec))
    if args.vindex:
        from larql.edit.state.walk_ffn import walk_model

        for k in (256, 512, 1024, 1536):
            measure("|gate| (walk KNN)", k, walk_model(args.vindex, top_k=k).next_logits)
    save_results("sparse_ffn", {"model": args.model, "rows": rows})


if __name__ == "__main__":
    main()
