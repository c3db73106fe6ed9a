"""A long stream of edits, each its own INSERT statement in one session (the way a user edits over
weeks), scored as it grows: do the earliest edits hold as later ones arrive, does an INSERT cost more
the more edits came before it, and does the model stay fluent on text no edit touched?

    python benchmarks/bench_edit_stream.py --vindex g.vindex [--data benchmarks/data/fictional_1000.json]
        [--n 100] [--checkpoints 10,30,100,300,1000] [--scored 100] [--method neuron] [--name edit-stream]

At each checkpoint (and after the last edit) the first `--scored` edits made so far are scored by
larql.edit.measure.evaluate, teacher-forced (ES / PS / NS) and by the model's own greedy continuation
(gen_ES / gen_PS), with the unrelated prompts' top-1s against the unedited model's and the perplexity
of the held-out text (larql/edit/measure/data/held_out.txt) against the unedited model's. Paraphrases
the value step optimises on (the prompt's own rewordings) are not held out and are dropped, as
bench_editing.py does. Each INSERT's wall time (its report included, as a user waits for it) is kept,
and its CPU time (this process's, less at the mercy of other jobs on the machine), each with a
least-squares slope against the number of earlier edits.
Writes benchmarks/results/NAME.json (after every INSERT) with the machine, its kernel tier and
the load average at the start and at each checkpoint.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

import larql.threads

larql.threads.configure()  # before numpy starts OpenBLAS, whose pool sizes itself once: one thread on a busy machine

import numpy as np  # noqa: E402
from bench_editing import machine  # noqa: E402
from results_file import save_results  # noqa: E402

DATA = Path(__file__).parent / "data" / "fictional_1000.json"
COLUMNS = ("ES", "PS", "NS", "gen_ES", "gen_PS", "unrelated_top1_kept", "perplexity", "perplexity_change")


def held_out_paraphrases(records: list) -> list:
    """`records` without the paraphrases the value step optimises on (the prompt in other words)."""
    from larql.edit.methods.facts import rewrites
    from larql.edit.methods.query_neuron import relation_forms

    def same(p: str) -> str:
        return " ".join(p.lower().split())

    out = []
    for r in records:
        trained = {same(p) for p in [*rewrites(r.prompt, r.subject), *relation_forms(r.fact())]}
        out.append(replace(r, paraphrases=tuple(p for p in r.paraphrases if same(p) not in trained)))
    return out


def slope(seconds: list[float]) -> float | None:
    """Least-squares seconds per INSERT gained per earlier edit (None for fewer than 2 INSERTs)."""
    if len(seconds) < 2:
        return None
    return float(np.polyfit(np.arange(len(seconds)), seconds, 1)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vindex", required=True)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--n", type=int, default=100, help="edits in the stream")
    parser.add_argument("--checkpoints", default="10,30,100,300,1000,3000,10000")
    parser.add_argument("--scored", type=int, default=100, help="the first this many edits are scored at each checkpoint")
    parser.add_argument("--method", default="neuron")
    parser.add_argument("--name", default="edit-stream")
    parser.add_argument("--held-out", default=None, help="the held-out text file (default: larql's shipped passage)")
    args = parser.parse_args()
    from larql.edit.measure.evaluate import (
        EVAL_PREFIX_SEED,
        EVAL_PREFIXES,
        held_out_perplexity,
        load_edit_set,
        score_records,
        summarise,
        unrelated_logps,
    )
    from larql.edit.measure.perplexity import held_out_text
    from larql.edit.methods.facts import model_prefixes
    from larql.lql.executor import execute
    from larql.lql.session import Session
    from larql.lql.unparse import q

    records = held_out_paraphrases(load_edit_set(args.data)[: args.n])
    checkpoints = sorted({c for c in map(int, args.checkpoints.split(",")) if c < len(records)} | {len(records)})
    session = Session()
    execute(f"USE {q(args.vindex)}", session)
    model = session.vindex.model()
    prefixes = model_prefixes(model, EVAL_PREFIXES, seed=EVAL_PREFIX_SEED)
    text = held_out_text(args.held_out)
    out: dict = {"model": session.vindex.index["model"], "data": Path(args.data).name, "edits": len(records),
                 "method": args.method, "scored": args.scored, "held_out": args.held_out or "larql/edit/measure/data/held_out.txt", "machine": machine(), "checkpoints": [],
                 "insert_seconds": [], "insert_cpu_seconds": []}

    base_scores: list = []  # the unedited model's scores of each of the first `scored` edits

    def score(made: int) -> dict:
        t0 = time.perf_counter()
        k = min(args.scored, made) if made else args.scored
        scores = score_records(model, records[:k], prefixes)
        row = summarise(scores, base_unrelated, unrelated_logps(model)) | held_out_perplexity(model, text, base_ppl)
        # the same edits' scores unedited (NS and the like are not 0 before any edit)
        before = summarise(base_scores[:k]) if made else {}
        base_scores.extend([] if made else scores)
        return {"after": made, "scored": k, **row, "unedited_same_edits": before,
                "scoring_seconds": time.perf_counter() - t0, "load_average": os.getloadavg()}

    print(f"scoring the unedited model ({min(args.scored, len(records))} edits' prompts, held-out text)", flush=True)
    base_unrelated, base_ppl = unrelated_logps(model), None
    out["unedited"] = score(0)
    base_ppl = out["unedited"]["perplexity"]
    seconds: list[float] = out["insert_seconds"]
    cpu: list[float] = out["insert_cpu_seconds"]  # this process's CPU time: less at the mercy of other jobs
    for i, r in enumerate(records):
        cols = "entity, relation, target, prompt"
        stmt = (f"INSERT INTO EDGES ({cols}) VALUES ({q(r.subject)}, {q(r.relation)}, {q(r.target_new)}, "
                f"{q(r.prompt)}) METHOD {args.method.upper()}")
        t0, c0 = time.perf_counter(), time.process_time()
        execute(stmt, session)
        seconds.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        print(f"  INSERT {i + 1}/{len(records)} {r.subject}: {seconds[-1]:.1f} s", flush=True)
        out["inserts_made"] = i + 1
        if i + 1 in checkpoints:
            row = score(i + 1)
            last = checkpoints[checkpoints.index(i + 1) - 1] if checkpoints.index(i + 1) else 0
            row["insert_seconds_mean"] = float(np.mean(seconds[last:]))  # the INSERTs since the last checkpoint
            out["checkpoints"].append(row)
            print(f"after {i + 1}: first {row['scored']} " + " ".join(f"{c} {row.get(c, float('nan')):.2f}" for c in COLUMNS)
                  + f"; INSERT {row['insert_seconds_mean']:.1f} s on average since the last checkpoint", flush=True)
        out["insert_seconds_slope"], out["insert_cpu_seconds_slope"] = slope(seconds), slope(cpu)
        save_results(args.name, out)  # after every INSERT: a run stopped early keeps its timings


if __name__ == "__main__":
    main()
