"""Fact editing, CounterFact-style, on the facts gemma3-270m knows: rewrite each to another object
of the same relation ("The capital of Japan is" -> Warsaw) and score it as ROME / MEMIT do.

    python benchmarks/bench_editing.py --vindex g.vindex [--limit N]

Per edit (first tokens of the objects, whose probabilities are compared):
- ES  efficacy: on the rewrite prompt, p(new) > p(true);
- PS  generalisation: the same on the relation's few-shot form (two worked examples first);
- NS  specificity: on the other facts of the relation, the true object still beats the new one;
- locality: mean KL(before || after) over held-out neutral prompts, as INSERT reports it.
Two protocols: "single" (each edit alone on the base, as ROME's table) and "sequential" (all edits
stacked on one overlay, scored at the end, as MEMIT's mass editing). Also the time per INSERT.
Writes benchmarks/results/editing.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from results_file import save_results

FACTS = Path(__file__).parent / "data" / "facts_gemma3_270m.json"


def counterfacts(facts: list[dict]) -> list[dict]:
    """Each fact with `new`: the next other object of the same relation (cyclically)."""
    out = []
    for f in facts:
        same = [g for g in facts if g["relation"] == f["relation"] and g["target"] != f["target"]]
        if not same:
            continue
        later = [g for g in same if facts.index(g) > facts.index(f)]
        out.append({**f, "new": (later or same)[0]["target"]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vindex", required=True, help="an inference-level vindex of gemma3-270m")
    parser.add_argument("--limit", type=int, default=0)
    args = parser.parse_args()
    from larql.edit import feature_insert as edit
    from larql.edit.view import edit_vindex
    from larql.model.generate import log_softmax
    from larql.model.interp import first_target_token
    from larql.vindex.probes import TEMPLATES, probe_prompt

    v = edit_vindex(args.vindex)
    m = v.model()
    cases = counterfacts(json.loads(FACTS.read_text())["facts"])
    if args.limit:
        cases = cases[: args.limit]
    tid = {}
    for c in cases:
        c["prompt"] = edit.relation_prompt(c["entity"], c["relation"])
        t = next((t for t in TEMPLATES if t.relation == c["relation"]), None)
        c["paraphrase"] = probe_prompt(t, c["entity"]) if t else None
        tid[c["target"]], tid[c["new"]] = first_target_token(m, c["target"]), first_target_token(m, c["new"])

    def logp(prompt: str) -> np.ndarray:
        return log_softmax(m.next_logits(m.tokenize(prompt)))

    def score(c: dict) -> dict:
        lp = logp(c["prompt"])
        es = float(lp[tid[c["new"]]] > lp[tid[c["target"]]])
        ps = None
        if c["paraphrase"]:
            lq = logp(c["paraphrase"])
            ps = float(lq[tid[c["new"]]] > lq[tid[c["target"]]])
        neigh = [n for n in cases if n["relation"] == c["relation"] and n["entity"] != c["entity"]
                 and tid[n["target"]] != tid[c["new"]]]
        ns = [float(lr[tid[n["target"]]] > lr[tid[c["new"]]]) for n in neigh for lr in [logp(n["prompt"])]]
        return {"es": es, "ps": ps, "ns": float(np.mean(ns)) if ns else None}

    def summary(rows: list[dict]) -> dict:
        def mean(key: str) -> float:
            vals = [r[key] for r in rows if r[key] is not None]
            return 100 * float(np.mean(vals)) if vals else float("nan")
        es, ps, ns = mean("es"), mean("ps"), mean("ns")
        s = 3 / (1 / es + 1 / ps + 1 / ns) if min(es, ps, ns) > 0 else 0.0
        return {"S": s, "ES": es, "PS": ps, "NS": ns}

    base = summary([score({**c, "new": c["new"]}) for c in cases])
    single, times, kls = [], [], []
    for c in cases:
        v.patches.pending.clear()
        v.patches.replay()
        t0 = time.perf_counter()
        r = edit.insert(v, c["entity"], c["relation"], c["new"])
        times.append(time.perf_counter() - t0)
        kls.append(r.locality_kl)
        single.append(score(c))
    v.patches.pending.clear()
    v.patches.replay()
    for c in cases:
        edit.insert(v, c["entity"], c["relation"], c["new"])
    sequential = summary([score(c) for c in cases])
    result = {"model": v.index["model"], "edits": len(cases), "unedited": base, "single": summary(single),
              "sequential": sequential, "seconds_per_insert": float(np.mean(times)),
              "single_locality_kl": float(np.mean(kls))}
    print(f"{len(cases)} counterfactual edits of facts gemma3-270m knows; first-token probabilities\n")
    print("| protocol | S | ES (efficacy) | PS (few-shot form) | NS (neighbours) |\n|---|---:|---:|---:|---:|")
    for name, row in (("unedited", base), ("single edits", result["single"]), ("all edits stacked", sequential)):
        print(f"| {name} | {row['S']:.1f} | {row['ES']:.1f} | {row['PS']:.1f} | {row['NS']:.1f} |")
    print(f"\nINSERT: {result['seconds_per_insert']:.1f} s each; neutral prompts' mean KL {result['single_locality_kl']:.4f}")
    save_results("editing", result)


if __name__ == "__main__":
    main()
