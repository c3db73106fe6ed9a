"""Accuracy cost of running the FFN with only its top-k features (by |act(gate) * up|) per layer.

    python benchmarks/bench_sparse_ffn.py [--model gemma3-270m]

For each k: top-1 agreement with the dense model and mean KL(dense || sparse) of the next-token
distribution over the 30 golden prompts. Writes benchmarks/results/sparse_ffn.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "golden" / "prompts.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    args = parser.parse_args()
    import larql
    from larql.model.generate import log_softmax
    from larql.model.hooks import sparse_ffn

    m = larql.load(args.model)
    prompts = json.loads(PROMPTS.read_text())
    dense = [log_softmax(m.next_logits(m.tokenize(p))) for p in prompts]
    rows = []
    print(f"| k (of {m.config.ffn}) | top-1 agreement | mean KL(dense || sparse) |\n|---:|---:|---:|")
    for k in (32, 128, 256, 512, 1024):
        spec = sparse_ffn(m.config.n_layers, k)
        agree, kls = 0, []
        for p, d in zip(prompts, dense):
            s = log_softmax(m.next_logits(m.tokenize(p), hooks=spec))
            agree += int(np.argmax(s) == np.argmax(d))
            kls.append(float(np.sum(np.exp(d) * (d - s))))
        rows.append({"k": k, "top1_agreement": agree / len(prompts), "mean_kl": float(np.mean(kls))})
        print(f"| {k} | {agree}/{len(prompts)} | {np.mean(kls):.3f} |")
    out = Path(__file__).parent / "results" / "sparse_ffn.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
