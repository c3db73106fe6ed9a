"""Fact editing, CounterFact-style, on facts the model knows: each edit rewrites a fact to another
object of its relation ("The capital of Japan is" -> Warsaw), scored by larql.edit.measure.evaluate on
prompts the edit never optimised on (natural paraphrases, the prompt behind unseen model-written
prefixes, neighbours, reverse prompts, unrelated prompts), single-edit and all-stacked.

    python benchmarks/bench_editing.py --vindex g.vindex [--data benchmarks/data/counterfact_gemma3_270m.json]
        [--methods rome,feature] [--protocols single,stacked,sequential] [--limit N] [--every K] [--layers 2,3,4] [--stats-tokens N]
        [--no-perplexity]

The decoy subjects a weight edit holds still are filtered so that none appears in any prompt of the
edit set (the neighbourhood score would otherwise be measured on keys the edit was told to keep).
Writes benchmarks/results/editing[-NAME].json with the machine's description.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import time
from dataclasses import replace
from pathlib import Path

from results_file import cpu_tier, save_results

import larql.threads

# OpenBLAS's busy-waiting threads, with another job on a core, made the value step crawl (a 1,000-fact
# INSERT: 3,762 s against 1,565 s on a quiet machine); configure() gives BLAS one thread when busy
larql.threads.configure()

DATA = Path(__file__).parent / "data" / "counterfact_gemma3_270m.json"
COLUMNS = ("S", "ES", "PS", "NS", "RS", "RelS", "ES_first", "PS_first", "NS_first", "token_acc", "para_token_acc", "GEN",
           "unrelated_top1_kept", "unrelated_kl", "fluency", "gen_ES", "gen_PS", "perplexity", "perplexity_change")


def machine() -> dict:
    import numba

    from larql.cli.benchmark import machine as larql_machine

    return {"platform": platform.platform(), "cpu": larql_machine()["cpu"],
            # the int8 candidate passes the value step and probes use, or their float32 form
            "tier": cpu_tier(), "threads": numba.get_num_threads(),
            "cpus": os.cpu_count(), "numba_threads": os.environ.get("NUMBA_NUM_THREADS", "default"),
            # what configure() left BLAS (one thread when the machine looked busy at start-up)
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
            "load_average": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vindex", required=True)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--methods", default="rome,feature")
    parser.add_argument("--protocols", default="single,stacked")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--every", type=int, default=1, help="take every k-th record (a spread over relations)")
    parser.add_argument("--name", default="")
    parser.add_argument("--layers", default="", help="edit layers, comma-separated (default: the crown layer)")
    parser.add_argument("--no-hold-relations", action="store_true",
                        help="do not hold the subjects' other relations in the value step (for comparison)")
    parser.add_argument("--key-on", default="subject", choices=("subject", "query"),
                        help="METHOD NEURON: key known subjects' neurons on the subject or on the fact's question")
    parser.add_argument("--stats-tokens", type=int, default=0, help="tokens of key statistics (default: larql's)")
    parser.add_argument("--no-perplexity", action="store_true",
                        help="skip the held-out text's perplexity (unedited, stacked and sequential)")
    args = parser.parse_args()
    from larql.edit.insert import insert_facts
    from larql.edit.measure.evaluate import EditRecord, evaluate, load_edit_set
    from larql.edit.measure.perplexity import held_out_text
    from larql.edit.methods.facts import rewrites
    from larql.edit.methods.query_neuron import relation_forms
    from larql.edit.methods.weight_edit import DECOY_SUBJECTS
    from larql.edit.state.view import edit_vindex

    records = load_edit_set(args.data)[:: args.every]
    if args.limit:
        records = records[: args.limit]
    # a paraphrase the value step itself optimises on (the prompt in other words) is not held out
    def same(p: str) -> str:
        return " ".join(p.lower().split())

    trained = {r.subject: {same(p) for p in [*rewrites(r.prompt, r.subject), *relation_forms(r.fact())]}
               for r in records}
    dropped = sum(same(p) in trained[r.subject] for r in records for p in r.paraphrases)
    records = [replace(r, paraphrases=tuple(p for p in r.paraphrases if same(p) not in trained[r.subject]))
               for r in records]
    text = " ".join(r.prompt + " " + " ".join(r.paraphrases) + " "
                    + " ".join(p for p, _ in r.neighbours + r.reverse + r.other_relations)
                    for r in records)
    decoys = [d for d in DECOY_SUBJECTS if d not in text]
    held_out = set(re.findall(r"\w+", text))  # no automatic neighbour may be a subject the scores use
    v = edit_vindex(args.vindex)
    m = v.model()
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    out: dict = {"model": v.index["model"], "data": Path(args.data).name, "edits": len(records), "machine": machine(),
                 "paraphrases_dropped_as_trained": dropped, "hold_relations": not args.no_hold_relations, "key_on": args.key_on,
                 "decoys_used": decoys, "layers": layers, "stats_tokens": args.stats_tokens or None, "methods": {}}
    out["held_out_text"] = None if args.no_perplexity else "larql/edit/measure/data/held_out.txt"
    for method in args.methods.split(","):
        def apply(batch: list[EditRecord], method: str = method):
            kept = len(v.patches.pending)
            insert_facts(v, [r.fact() for r in batch], method, layers, measure=False, decoys=decoys,
                         exclude=held_out, stats_tokens=args.stats_tokens or None,
                         hold_relations=not args.no_hold_relations, key_on=args.key_on)
            return lambda: v.patches.undo(len(v.patches.pending) - kept)

        t0 = time.perf_counter()
        rep = evaluate(m, records, apply, args.protocols.split(","), progress=lambda s: print("  ", s, flush=True),
                       held_out=None if args.no_perplexity else held_out_text())
        out["methods"][method] = rep.to_json() | {"wall_seconds": time.perf_counter() - t0}
        save_results("editing" + (f"-{args.name}" if args.name else ""), out)  # before printing: keep the data
        print(f"\n{method}: {len(records)} edits of {out['model']} ({out['data']})")
        print("| protocol | " + " | ".join(COLUMNS) + " | s/edit |")
        print("|---|" + "---:|" * (len(COLUMNS) + 1))
        for name, row, secs in (("unedited", rep.unedited, None), ("single", rep.single, rep.seconds_per_edit),
                                ("stacked", rep.stacked, rep.seconds_stacked),
                                ("sequential", rep.sequential, rep.seconds_sequential)):
            if row is not None:
                cells = ["—" if row.get(c) is None else f"{row[c]:.3f}" if c == "unrelated_kl" else f"{row[c]:.1f}"
                         for c in COLUMNS]
                print(f"| {name} | " + " | ".join(cells) + f" | {'' if secs is None else f'{secs:.1f}'} |")


if __name__ == "__main__":
    main()
