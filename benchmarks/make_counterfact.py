"""Build a CounterFact-style edit set for a bundled model, keeping only what that model gets right.

    python benchmarks/make_counterfact.py --model gemma3-270m    # -> data/counterfact_gemma3_270m.json
    python benchmarks/make_counterfact.py --model smollm2-135m   # -> data/counterfact_smollm2_135m.json

Inputs (both hand-written, in benchmarks/data/):
- facts_gemma3_270m.json: the facts (entity, relation, target, check_prompt). Each fact with another
  object in its relation becomes an edit: subject = entity, prompt = check_prompt, target_true =
  target, target_new = bench_editing.counterfacts' pick (the next other object of the relation,
  cyclically). The same pairs are used for every model, so the sets are comparable.
- counterfact_source.json: per fact, candidate paraphrases, reverse prompts and generation prompts;
  per relation, a prompt template and a pool of extra subjects with their true objects (neighbours).

Neighbour candidates, in CounterFact's order: (a) other subjects of the relation with the SAME true
object (Mexico for Spain -> Spanish), then (b) the relation's other subjects with their own objects
(rotated per edit for variety); a candidate whose target is the edit's target_new is never used.

Verification, with the model itself: a prompt P "prefers" A over B when the teacher-forced mean NLL
of " " + A's tokens after P is lower than that of B (whole target, not only its first token). An edit
is kept only if its prompt prefers target_true over target_new; a paraphrase only if it does too; a
neighbour / reverse prompt only if it prefers its own target over the edit's target_new. An edit with
fewer than --min-paraphrases paraphrases or --min-neighbours neighbours left is dropped. Each prompt
is prefilled once; each target continues from the prompt's KV cache.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data"
FACTS = DATA / "facts_gemma3_270m.json"
SOURCE = DATA / "counterfact_source.json"
MAX_NEIGHBOURS = 6
MAX_PARAPHRASES = 5


def counterfacts(facts: list[dict]) -> list[dict]:
    """The same pick as benchmarks/bench_editing.py's `counterfacts` (kept in step with it)."""
    try:
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_editing import counterfacts as pick

        return pick(facts)
    finally:
        sys.path.pop(0)


def candidates(facts: list[dict], source: dict) -> list[dict]:
    """Unverified edit records with every candidate paraphrase / neighbour / reverse prompt."""
    templates, pool, hand = source["templates"], source["neighbour_pool"], source["facts"]
    by_rel: dict[str, list[tuple[str, str, str]]] = defaultdict(list)  # relation -> (subject, prompt, target)
    for f in facts:
        by_rel[f["relation"]].append((f["entity"], f["check_prompt"], f["target"]))
    for rel, extra in pool.items():
        known = {s for s, _, _ in by_rel[rel]}
        by_rel[rel] += [(s, templates[rel].format(s), t) for s, t in extra.items() if s not in known]
    edits = []
    for k, c in enumerate(counterfacts(facts)):
        h = hand[f"{c['relation']}/{c['entity']}"]
        others = [n for n in by_rel[c["relation"]] if n[0] != c["entity"] and n[2] != c["new"]]
        same = [n for n in others if n[2] == c["target"]]  # (a) same true object
        rest = [n for n in others if n[2] != c["target"]]  # (b) the relation's other subjects
        r = (3 * k) % len(rest) if rest else 0
        order = same + rest[r:] + rest[:r]
        edits.append({
            "subject": c["entity"], "relation": c["relation"], "prompt": c["check_prompt"],
            "target_true": c["target"], "target_new": c["new"],
            "paraphrases": [p for p in h["paraphrases"] if p != c["check_prompt"]],
            "neighbours": [{"prompt": p, "target": t} for _, p, t in order],
            "reverse": h.get("reverse", []),
            "generation_prompts": h.get("generation_prompts", []),
        })
    return edits


class Scorer:
    """Mean NLL of whole targets after prompts: one prefill per prompt, targets from its KV cache."""

    def __init__(self, model) -> None:  # type: ignore[no-untyped-def]
        self.m = model
        self.prefills = 0
        self.top1: dict[tuple[str, str], bool] = {}  # (prompt, target): its first token is the greedy top-1

    def target_ids(self, target: str) -> list[int]:
        ids = self.m.tokenizer.tok.encode(" " + target.strip(), add_special_tokens=False).ids
        if not ids:
            raise ValueError(f"target {target!r} tokenizes to nothing")
        return [int(i) for i in ids]

    @staticmethod
    def _logp(logits: np.ndarray, tok: int) -> float:
        z = logits.astype(np.float64)
        mx = float(z.max())
        return float(z[tok] - mx - math.log(float(np.exp(z - mx).sum())))

    def nlls(self, prompt: str, targets: list[str]) -> dict[str, float]:
        ids = self.m.tokenize(prompt)
        toks = {t: self.target_ids(t) for t in targets}
        cache = self.m.new_cache(len(ids) + max(len(v) for v in toks.values()))
        first = self.m.next_logits(ids, cache)
        self.prefills += 1
        n = cache.length
        out = {}
        best = int(np.argmax(first))
        for t, tt in toks.items():
            self.top1[(prompt, t)] = tt[0] == best
            lps = [self._logp(first, tt[0])]
            cache.length = n  # fork: later positions are overwritten, earlier ones are shared
            for prev, tok in itertools.pairwise(tt):
                lps.append(self._logp(self.m.next_logits([prev], cache), tok))
            out[t] = -float(np.mean(lps))
        return out


def verify(model, edits: list[dict], min_para: int, min_neigh: int) -> tuple[list[dict], dict]:  # type: ignore[no-untyped-def]
    """Score every (prompt, target) the edits need, then filter. Returns (kept edits, stats)."""
    need: dict[str, set[str]] = defaultdict(set)
    for e in edits:
        for p in [e["prompt"], *e["paraphrases"]]:
            need[p] |= {e["target_true"], e["target_new"]}
        for n in [*e["neighbours"], *e["reverse"]]:
            need[n["prompt"]] |= {n["target"], e["target_new"]}
    sc = Scorer(model)
    t0 = time.perf_counter()
    nll = {p: sc.nlls(p, sorted(ts)) for p, ts in need.items()}
    seconds = time.perf_counter() - t0

    def prefers(prompt: str, good: str, bad: str) -> bool:
        return nll[prompt][good] < nll[prompt][bad]

    kept, dropped = [], []
    st = defaultdict(int)
    for e in edits:
        new, true = e["target_new"], e["target_true"]
        label = f"{e['subject']} -[{e['relation']}]-> {true} (new {new})"
        if not prefers(e["prompt"], true, new):
            dropped.append(f"{label}: prompt prefers the new target "
                           f"(NLL {nll[e['prompt']][true]:.2f} vs {nll[e['prompt']][new]:.2f})")
            continue
        paras = [p for p in e["paraphrases"] if prefers(p, true, new)]
        neigh = [n for n in e["neighbours"] if prefers(n["prompt"], n["target"], new)]
        rev = [n for n in e["reverse"] if prefers(n["prompt"], n["target"], new)]
        st["paraphrases_dropped"] += len(e["paraphrases"]) - len(paras)
        st["neighbours_dropped"] += len(e["neighbours"]) - len(neigh)
        st["reverse_dropped"] += len(e["reverse"]) - len(rev)
        st["paraphrase_candidates"] += len(e["paraphrases"])
        st["neighbour_candidates"] += len(e["neighbours"])
        st["reverse_candidates"] += len(e["reverse"])
        for p in e["paraphrases"]:
            if not prefers(p, true, new):
                print(f"  drop paraphrase  {p!r}: {true} {nll[p][true]:.2f} vs {new} {nll[p][new]:.2f}")
        for kind, group in (("neighbour", e["neighbours"]), ("reverse", e["reverse"])):
            for n in group:
                if not prefers(n["prompt"], n["target"], new):
                    print(f"  drop {kind:10s} {n['prompt']!r}: {n['target']} {nll[n['prompt']][n['target']]:.2f} "
                          f"vs {new} {nll[n['prompt']][new]:.2f}  (edit {e['subject']} -> {new})")
        if len(paras) < min_para or len(neigh) < min_neigh:
            dropped.append(f"{label}: only {len(paras)} paraphrases / {len(neigh)} neighbours prefer their targets")
            continue
        kept.append({**e, "paraphrases": paras[:MAX_PARAPHRASES], "neighbours": neigh[:MAX_NEIGHBOURS], "reverse": rev})
    # a stricter diagnostic (not a filter): is target_true's first token the greedy top-1?
    st["prompt_top1"] = sum(sc.top1[(e["prompt"], e["target_true"])] for e in kept)
    st["paraphrase_top1"] = sum(sc.top1[(p, e["target_true"])] for e in kept for p in e["paraphrases"])
    st["paraphrases_kept"] = sum(len(e["paraphrases"]) for e in kept)
    st.update(candidates=len(edits), kept=len(kept), dropped=len(dropped), prefills=sc.prefills,
              seconds=round(seconds, 1), dropped_edits=dropped)
    return kept, dict(st)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m", help="a bundled alias (gemma3-270m, smollm2-135m) or a path")
    parser.add_argument("--out", default=None, help="default: benchmarks/data/counterfact_<model>.json")
    parser.add_argument("--min-paraphrases", type=int, default=2)
    parser.add_argument("--min-neighbours", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="numba threads (1 is fastest on a busy machine)")
    args = parser.parse_args()
    import larql

    if args.threads:
        import numba

        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    facts = json.loads(FACTS.read_text())["facts"]
    source = json.loads(SOURCE.read_text())
    edits = candidates(facts, source)
    model = larql.load(args.model)
    kept, st = verify(model, edits, args.min_paraphrases, args.min_neighbours)
    slug = Path(args.model).name.replace("-", "_").replace(".", "_")
    out = Path(args.out) if args.out else DATA / f"counterfact_{slug}.json"

    def avg(key: str) -> float:
        return sum(len(e[key]) for e in kept) / max(1, len(kept))

    description = (
        f"CounterFact-style edits of the facts in facts_gemma3_270m.json, verified on {args.model} by "
        f"benchmarks/make_counterfact.py from counterfact_source.json. target_new is the next other object of the "
        f"same relation (bench_editing.counterfacts). Verification: teacher-forced whole-target mean NLL "
        f"(' ' + target, no special tokens). An edit is kept only if its prompt gives target_true a lower NLL than "
        f"target_new; a paraphrase only if it does too; a neighbour (CounterFact order: other subjects with the same "
        f"true object first, then the relation's other subjects) and a reverse prompt only if it gives its own target "
        f"a lower NLL than the edit's target_new; edits need >= {args.min_paraphrases} paraphrases and >= "
        f"{args.min_neighbours} neighbours (at most {MAX_PARAPHRASES} and {MAX_NEIGHBOURS} kept). "
        f"Kept {st['kept']} of {st['candidates']} edits ({st['dropped']} dropped: "
        f"{'; '.join(st['dropped_edits']) or 'none'}). Candidates dropped: {st['paraphrases_dropped']} of "
        f"{st['paraphrase_candidates']} paraphrases, {st['neighbours_dropped']} of {st['neighbour_candidates']} "
        f"neighbours, {st['reverse_dropped']} of {st['reverse_candidates']} reverse prompts. Per kept edit on "
        f"average: {avg('paraphrases'):.1f} paraphrases, {avg('neighbours'):.1f} neighbours, {avg('reverse'):.1f} "
        f"reverse prompts, {avg('generation_prompts'):.1f} generation prompts (not verified: open continuations)."
    )
    doc = {"format": "larql-edit-set", "version": 1, "model": args.model, "description": description, "edits": kept}
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(description)
    print(f"diagnostic: target_true's first token is the greedy top-1 on {st['prompt_top1']}/{st['kept']} prompts "
          f"and {st['paraphrase_top1']}/{st['paraphrases_kept']} kept paraphrases")
    print(f"{st['prefills']} prompts scored in {st['seconds']} s -> {out}")


if __name__ == "__main__":
    main()
