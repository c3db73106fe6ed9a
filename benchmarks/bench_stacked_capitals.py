"""Edits that pile up: ten capitals rewritten by ten INSERTs one after another, then what else
moved — the 24 unrelated prompts INSERT and the edit evaluation use, and prompts about other capitals
and cities ("Berlin is a city in", "Paris is the capital of": the reverse relation) — and whether each
edit reaches a paraphrase it never saw ("X's capital city is").

    python benchmarks/bench_stacked_capitals.py --vindex g.vindex [--method neuron] [--name NAME]

Writes benchmarks/results/stacked-capitals[-NAME].json with the machine's description.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import larql.threads

larql.threads.configure()  # before numpy starts OpenBLAS, whose pool sizes itself once: one thread on a busy machine

import numpy as np  # noqa: E402
from results_file import save_results  # noqa: E402

# (country, new capital): every new capital is another country's real one
EDITS = (("Japan", "Warsaw"), ("France", "Rome"), ("Spain", "Cairo"), ("Canada", "Madrid"), ("Egypt", "Ottawa"),
         ("Brazil", "Oslo"), ("Australia", "Lima"), ("Poland", "Canberra"), ("Peru", "Tokyo"),
         ("Norway", "Islamabad"))
OTHER_CAPITALS = ("The Eiffel Tower is in", "The capital of Germany is", "Tokyo is the capital of",
                  "Paris is the capital of", "Chopin was born in", "The capital of Italy is")  # UNRELATED has Berlin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vindex", required=True)
    parser.add_argument("--method", default=None, help="INSERT's METHOD (default: the model's)")
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    from larql.edit.insert import insert_facts
    from larql.edit.measure.evaluate import UNRELATED
    from larql.edit.methods.facts import Fact
    from larql.edit.state.view import edit_vindex
    from larql.model.interp import kl

    v = edit_vindex(args.vindex)
    m = v.model()
    prompts = list(dict.fromkeys(UNRELATED + OTHER_CAPITALS))

    def logps() -> list[np.ndarray]:
        out = []
        for p in prompts:
            x = m.next_logits(m.tokenize(p)).astype(np.float64)
            out.append(x - x.max() - np.log(np.exp(x - x.max()).sum()))
        return out

    def top1(prompt: str) -> str:
        return m.tokenizer.token_text(int(np.argmax(m.next_logits(m.tokenize(prompt))))).strip()

    before = logps()
    t0 = time.perf_counter()
    for country, capital in EDITS:
        insert_facts(v, [Fact(country, f"The capital of {country} is", capital, "capital")], args.method, measure=False)
    seconds = time.perf_counter() - t0
    after = logps()
    kept = [int(np.argmax(b) == np.argmax(a)) for b, a in zip(before, after)]
    moved = {p: top1(p) for p, k in zip(prompts, kept) if not k}
    reached = {country: top1(f"{country}'s capital city is") for country, _ in EDITS}
    out = {"model": v.index["model"], "method": args.method or "default", "edits": [list(e) for e in EDITS],
           "kept": sum(kept), "of": len(prompts), "kl": float(np.mean([kl(b, a) for b, a in zip(before, after)])),
           "moved": moved, "berlin": top1("Berlin is a city in"),
           "paraphrase_reached": sum(bool(reached[c]) and t.startswith(reached[c]) for c, t in EDITS), "paraphrase": reached,
           "seconds": seconds, "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "load_average": os.getloadavg()}}
    save_results("stacked-capitals" + (f"-{args.name}" if args.name else ""), out)
    print(f"| 10 stacked INSERTs ({out['method']}) | unrelated + capital prompts keeping their top-1 | KL | "
          f"\"Berlin is a city in\" | paraphrase \"X's capital city is\" -> new target | s |")
    print("|---|---:|---:|---|---:|---:|")
    print(f"| {v.index['model']} | {out['kept']} / {out['of']} | {out['kl']:.4f} | {out['berlin']} | "
          f"{out['paraphrase_reached']} / {len(EDITS)} | {seconds:.1f} |")
    for p, t in moved.items():
        print(f"   moved: {p!r} -> {t!r}")


if __name__ == "__main__":
    main()
