"""Why a METHOD NEURON batch misses: insert a batch of facts, then probe every installed neuron's
activation on each fact's prompt and paraphrases (the edited model), and tabulate success against
what fired — the fact's own neuron at its subject (1.0 = the strength it was built for) and the
*other* neurons opening (activation over OPEN of design) at the subject's last token or elsewhere.

    python benchmarks/bench_neuron_probe.py --vindex g.vindex [--data benchmarks/data/fictional_1000.json]
        [--every 3] [--limit 300] [--layers 3,4,5,6,7,8]

Prints tables by layer, by the number of other neurons opening, by own strength and by paraphrase
template; writes benchmarks/results/neuron-probe[-NAME].json. Success is every target token the
top-1, teacher-forced, on the prompt (ES) or on a paraphrase the edit never saw (PS).
"""

from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict
from pathlib import Path

import larql.threads

larql.threads.configure()  # before numpy starts OpenBLAS, whose pool sizes itself once: one thread on a busy machine

import numpy as np  # noqa: E402
from results_file import save_results  # noqa: E402

OPEN = 0.2  # of the activation a neuron was built to reach at its subject


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vindex", required=True)
    parser.add_argument("--data", default=str(Path(__file__).parent / "data" / "fictional_1000.json"))
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--layers", default="", help="neuron layers, comma-separated (default: the model's)")
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    from larql.edit.insert import insert_facts
    from larql.edit.measure.evaluate import load_edit_set
    from larql.edit.measure.scoring import Scorer
    from larql.edit.methods.capture import capture_batch
    from larql.edit.methods.neuron import PRE_ACTIVATION
    from larql.edit.methods.weight_edit import DECOY_SUBJECTS
    from larql.edit.state.edited import installed
    from larql.edit.state.view import edit_vindex
    from larql.model.ffn import gated
    from larql.model.forward import norm
    from larql.model.targets import subject_position

    records = load_edit_set(args.data)[:: args.every][: args.limit]
    text = " ".join(r.prompt + " " + " ".join(r.paraphrases) + " " + " ".join(p for p, _ in r.neighbours)
                    for r in records)
    v = edit_vindex(args.vindex)
    m = v.model()
    t0 = time.perf_counter()
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    rep = insert_facts(v, [r.fact() for r in records], "neuron", layers, measure=False,
                       decoys=[d for d in DECOY_SUBJECTS if d not in text], exclude=set(re.findall(r"\w+", text)))
    seconds = time.perf_counter() - t0
    ops = {layer: installed(v, layer, neurons=True) for layer in rep.layers}
    owner = {op.entity: (layer, j) for layer, got in ops.items() for j, op in enumerate(got)}
    weights = {layer: (np.stack([op.vectors["gate"] for op in got], 1), np.stack([op.vectors["up"] for op in got], 1))
               for layer, got in ops.items()}
    design = float(gated(m.config.activation, np.array([[PRE_ACTIVATION]], np.float32),
                         np.array([[1.0]], np.float32))[0, 0])
    sc = Scorer(m)
    items = [(r, p, p == r.prompt) for r in records for p in (r.prompt, *r.paraphrases)]
    runs = [subject_position(m, p, r.subject) for r, p, _ in items]
    names = [f"blocks.{layer}.hook_resid_mid" for layer in rep.layers]
    rows = []
    for (r, p, is_prompt), (_, s), cap in zip(items, runs, capture_batch(m, [ids for ids, _ in runs], names)):
        home, mine = owner[r.subject]
        own, at_subject, elsewhere = 0.0, 0, 0
        for layer in rep.layers:
            x = norm(m.config, cap[f"blocks.{layer}.hook_resid_mid"], m.weights.layers[layer].ffn_norm)  # (T, hidden)
            act = np.abs(gated(m.config.activation, x @ weights[layer][0], x @ weights[layer][1])) / design  # (T, n)
            if layer == home:
                own = float(act[s, mine])
                act[:, mine] = 0.0
            at_subject += int((act[s] > OPEN).sum())
            elsewhere += int((np.delete(act, s, axis=0) > OPEN).sum())
        hit = all(top for _, top in sc.token_logps(sc.prompt(p), r.target_new))
        rows.append({"subject": r.subject, "relation": r.relation, "layer": home, "prompt": is_prompt,
                     "template": p.replace(r.subject, "{}"), "hit": hit, "own": own,
                     "others_at_subject": at_subject, "others_elsewhere": elsewhere})

    def line(label: str, sel: list[dict]) -> str:
        es = [d["hit"] for d in sel if d["prompt"]]
        ps = [d["hit"] for d in sel if not d["prompt"]]
        own = np.median([d["own"] for d in sel]) if sel else float("nan")
        return (f"| {label} | {len(es)} | {100 * np.mean(es) if es else float('nan'):.1f} | {len(ps)} | "
                f"{100 * np.mean(ps) if ps else float('nan'):.1f} | {own:.2f} |")

    print(f"\n{len(records)} facts, layers {rep.layers}, INSERT {seconds:.0f} s")
    print("| rows | prompts | ES | paraphrases | PS | own (median) |\n|---|---:|---:|---:|---:|---:|")
    print(line("all", rows))
    for layer in rep.layers:
        print(line(f"layer {layer}", [d for d in rows if d["layer"] == layer]))
    for key in ("others_at_subject", "others_elsewhere"):
        for lo, hi in ((0, 0), (1, 1), (2, 3), (4, 10**9)):
            print(line(f"{key} {lo}{'' if lo == hi else '+' if hi > 99 else f'-{hi}'}",
                       [d for d in rows if lo <= d[key] <= hi]))
    for lo, hi in ((-1.0, 0.3), (0.3, 0.6), (0.6, 0.9), (0.9, 99.0)):
        print(line(f"own {lo}..{hi}", [d for d in rows if lo <= d["own"] < hi]))
    by_template: dict[str, list[dict]] = defaultdict(list)
    for d in rows:
        if not d["prompt"]:
            by_template[f"{d['relation']}: {d['template']}"].append(d)
    for label, sel in sorted(by_template.items()):
        print(line(label, sel))
    save_results("neuron-probe" + (f"-{args.name}" if args.name else ""),
                 {"model": v.index["model"], "data": Path(args.data).name, "facts": len(records),
                  "layers": list(rep.layers), "insert_seconds": seconds, "open": OPEN, "rows": rows})


if __name__ == "__main__":
    main()
