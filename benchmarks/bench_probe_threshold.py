"""Where DESCRIBE's probe edges should stop: the probability a probe's answer needs before it is
shown, chosen on measured data.

    python benchmarks/bench_probe_threshold.py

Known facts: every fact of benchmarks/data/facts_gemma3_270m.json whose relation has a probe
template; a probe is right when its answer names the fact's target. Made-up names: 40 invented
countries, cities and people the model cannot know; every probe edge shown for one is false.
For each threshold it prints the share of known facts shown correctly, the share of made-up names
that show at least one edge, and false edges per made-up name. Writes
benchmarks/results/probe_threshold.json (with every probe's answer and probability).
"""

from __future__ import annotations

import json
from pathlib import Path

from results_file import save_results

import larql
from larql.vindex.probes import MIN_PROB, TEMPLATES, probe_candidates

FACTS = Path(__file__).parent / "data" / "facts_gemma3_270m.json"
# invented; none is a real place or person (checked by hand against the model's own answers below)
MADE_UP = ["Vrellandia", "Zorbistan", "Quelmaria", "Ostravania", "Nembrosia", "Kalvoria", "Tesmarind", "Draskovel",
           "Pellunia", "Varnessa", "Brisklow", "Tarnhollow", "Velmora", "Ysterhaven", "Gorlanth", "Ombrevik",
           "Sallowmere", "Cresthaven Vale", "Marnovka", "Thessquay", "Orlen Vask", "Mirela Tosquin", "Davor Kelmund",
           "Ilsabet Fruhwane", "Casimir Ondrevey", "Thalia Brennuck", "Joaquin Vessarde", "Ulric Hammarsk",
           "Seraphine Dulocq", "Bram Teodorsk", "Kesmaria", "Lundravia", "Porvenzia", "Ashkeloth", "Wenmarrow",
           "Elvastan", "Norquay Isles", "Halvorica", "Sundrelia", "Marrowdeep"]
THRESHOLDS = (0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7)


def main() -> None:
    m = larql.load("gemma3-270m")
    by_relation = {t.relation: t for t in TEMPLATES}
    facts = [f for f in json.loads(FACTS.read_text())["facts"] if f["relation"] in by_relation]
    known = []
    for f in facts:
        edges = probe_candidates(m, f["entity"], (by_relation[f["relation"]],))
        right = bool(edges) and f["target"].lower() in edges[0].target.lower()
        known.append({"entity": f["entity"], "relation": f["relation"], "target": f["target"],
                      "answer": edges[0].target if edges else "", "prob": edges[0].score if edges else 0.0,
                      "right": right})
    made_up = [{"entity": e, "edges": [(x.label, x.target, x.score) for x in probe_candidates(m, e)]} for e in MADE_UP]
    rows = []
    for t in THRESHOLDS:
        recall = sum(k["right"] and k["prob"] >= t for k in known) / len(known)
        wrong_known = sum((not k["right"]) and k["prob"] >= t for k in known) / len(known)
        any_false = sum(any(p >= t for _, _, p in x["edges"]) for x in made_up) / len(made_up)
        per_name = sum(sum(p >= t for _, _, p in x["edges"]) for x in made_up) / len(made_up)
        rows.append({"threshold": t, "known_right": recall, "known_wrong": wrong_known,
                     "made_up_any": any_false, "made_up_edges_per_name": per_name})
    print(f"{len(known)} known facts with a probe template; {len(made_up)} made-up names x {len(TEMPLATES)} templates")
    print("| threshold | known facts shown right | known shown wrong | made-up names with an edge | "
          "false edges per made-up name |\n|---:|---:|---:|---:|---:|")
    for r in rows:
        mark = " (current)" if abs(r["threshold"] - MIN_PROB) < 1e-9 else ""
        print(f"| {r['threshold']}{mark} | {100 * r['known_right']:.0f}% | {100 * r['known_wrong']:.0f}% | "
              f"{100 * r['made_up_any']:.0f}% | {r['made_up_edges_per_name']:.2f} |")
    save_results("probe_threshold", {"rows": rows, "known": known, "made_up": made_up})


if __name__ == "__main__":
    main()
