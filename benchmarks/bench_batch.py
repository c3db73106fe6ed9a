"""Batched forward passes where many short prompts are scored, each beside the one-by-one way in the
same run: DESCRIBE's 8 probe prompts, the edit evaluation's teacher-forced scoring, the unrelated
prompts, greedy continuations; and the gate KNN on Gemma-3-4B shapes beside faiss's fp16 index
(the index a process that only browses uses). gemma3-270m.

    python benchmarks/bench_batch.py [--vindex g.vindex] [--records 10]

Prints a table and writes benchmarks/results/batch.json (with the machine and its load average).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import larql.threads

larql.threads.configure()

import numpy as np  # noqa: E402
from results_file import save_results  # noqa: E402

import larql  # noqa: E402
from larql.cli.benchmark import machine  # noqa: E402
from larql.edit.measure import evaluate as ev  # noqa: E402
from larql.edit.methods.facts import model_prefixes, target_ids  # noqa: E402
from larql.model.generate import log_softmax  # noqa: E402
from larql.model.prefix import PrefixCache  # noqa: E402
from larql.vindex.probes import MAX_ANSWER_TOKENS, TEMPLATES, probe_prompt, run_probes  # noqa: E402

ENTITIES = ("France", "Mozart", "Japan", "the Amazon", "Einstein")


def seconds(fn: Callable[[], object], repeat: int = 1) -> float:
    """Median wall time of `repeat` calls."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def probes_one_by_one(m: larql.Model, entity: str) -> None:
    """What DESCRIBE did before: each template alone, a prefill and up to 3 greedy steps."""
    for t in TEMPLATES:
        ids = m.tokenize(probe_prompt(t, entity))
        cache = m.new_cache(len(ids) + MAX_ANSWER_TOKENS)
        logits = m.next_logits(ids, cache)
        answer = [int(np.argmax(logits))]
        float(np.exp(log_softmax(logits)[answer[0]]))
        while len(answer) < MAX_ANSWER_TOKENS and not any(s in m.detokenize(answer) for s in ".,\n;"):
            answer.append(int(np.argmax(m.next_logits([answer[-1]], cache))))


def scores_one_by_one(m: larql.Model, pairs: list[tuple[str, str]]) -> None:
    """What the evaluation did before: a prefill per prompt, then each target a token at a time."""
    for prompt, target in pairs:
        toks = target_ids(m, target)
        ids = m.tokenize(prompt)
        cache = m.new_cache(len(ids) + len(toks))
        log_softmax(m.next_logits(ids, cache), np.float64)
        for tok in toks[1:]:
            log_softmax(m.next_logits([tok], cache), np.float64)


def knn_faiss_ms(gates: list[np.ndarray], queries: np.ndarray) -> float:
    import faiss

    indexes = []
    for g in gates:
        index = faiss.IndexScalarQuantizer(g.shape[1], faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        index.add_sa_codes(np.ascontiguousarray(g).view(np.uint8))
        indexes.append(index)
    times = []
    for q in queries:
        for index in indexes:
            t0 = time.perf_counter()
            index.search(np.stack([q, -q]), 10)
            times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vindex", help="an inference-level gemma3-270m vindex (for DESCRIBE)")
    parser.add_argument("--records", type=int, default=10, help="CounterFact records to score")
    args = parser.parse_args()
    res: dict[str, Any] = {"machine": machine()}
    m = larql.load(args.vindex or "gemma3-270m")
    probes_one_by_one(m, "Germany")  # compile, repack, warm
    run_probes(m, TEMPLATES, "Germany")

    res["probes_one_by_one_ms"] = seconds(lambda: [probes_one_by_one(m, e) for e in ENTITIES]) / len(ENTITIES) * 1e3

    def cold() -> None:
        for e in ENTITIES:
            m.prefixes = PrefixCache()  # nothing kept: the first DESCRIBE after loading
            run_probes(m, TEMPLATES, e, 0.7)
    res["probes_batch_first_ms"] = seconds(cold) / len(ENTITIES) * 1e3
    run_probes(m, TEMPLATES, "Germany", 0.7)
    res["probes_batch_ms"] = seconds(lambda: [run_probes(m, TEMPLATES, e, 0.7) for e in ENTITIES]) / len(ENTITIES) * 1e3
    if args.vindex:
        from larql.vindex import open_vindex
        from larql.vindex.describe import describe

        v = open_vindex(args.vindex)
        describe(v, "Germany", model=m)
        res["describe_ms"] = seconds(lambda: [describe(v, e, model=m) for e in ENTITIES]) / len(ENTITIES) * 1e3

    records = ev.load_edit_set(Path(__file__).parent / "data" / "counterfact_gemma3_270m.json")[: args.records]
    prefixes = model_prefixes(m, ev.EVAL_PREFIXES, seed=ev.EVAL_PREFIX_SEED)
    pairs = list(dict.fromkeys(p for r in records for p in ev._pairs(r, prefixes)))
    res["scored_pairs"] = len(pairs)
    res["scoring_one_by_one_s"] = seconds(lambda: scores_one_by_one(m, pairs))
    res["scoring_batch_s"] = seconds(lambda: ev.Scorer(m).prefetch(pairs))
    res["score_records_s"] = seconds(lambda: ev.score_records(m, records, prefixes))
    res["unrelated_one_by_one_s"] = seconds(lambda: [m.next_logits(m.tokenize(p)) for p in ev.UNRELATED])

    def unrelated_batch() -> None:
        ev._unrelated.clear()  # the pass itself, not the result kept for the model's revision
        ev.unrelated_logps(m)
    res["unrelated_batch_s"] = seconds(unrelated_batch)
    gen = [m.tokenize(p) for p in ev.UNRELATED[:8]]
    res["generate_one_by_one_s"] = seconds(lambda: [m.generate(p, max_new_tokens=16) for p in gen])
    res["generate_batch_s"] = seconds(lambda: m.generate_batch(gen, 16))

    sys_path = Path(__file__).parent
    import sys

    sys.path.insert(0, str(sys_path))
    from bench_vindex import knn_ms, synthetic_4b

    from larql.vindex import open_vindex as open_store

    big = open_store(synthetic_4b(Path(tempfile.mkdtemp()) / "synthetic-4b.vindex"))
    queries = np.random.default_rng(1).standard_normal((8, big.hidden)).astype(np.float32)
    res["knn_4b_first_ms"], res["knn_4b_ms"] = knn_ms(big, queries)
    res["knn_4b_faiss_ms"] = knn_faiss_ms([big.gate_vectors(i) for i in range(big.num_layers)], queries[1:])
    res["machine"]["load_average_end"] = machine()["load_average"]

    rows = [("DESCRIBE's 8 probes, one by one (ms)", "probes_one_by_one_ms"),
            ("  in one batch, first after loading (ms)", "probes_batch_first_ms"),
            ("  in one batch, examples kept (ms)", "probes_batch_ms"),
            ("DESCRIBE with probe edges, whole (ms)", "describe_ms"),
            (f"teacher-forced scoring, {len(pairs)} pairs, one by one (s)", "scoring_one_by_one_s"),
            ("  batched (s)", "scoring_batch_s"),
            (f"score_records, {len(records)} CounterFact records (s)", "score_records_s"),
            ("24 unrelated prompts, one by one / batched (s)", ("unrelated_one_by_one_s", "unrelated_batch_s")),
            ("8 greedy continuations of 16 tokens, one by one / batched (s)", ("generate_one_by_one_s", "generate_batch_s")),
            ("gate KNN per layer, Gemma-3-4B shapes: faiss fp16 / int8 + bound (ms)", ("knn_4b_faiss_ms", "knn_4b_ms"))]
    mach = res["machine"]
    print(f"\n{mach['cpu']}, {mach['cpus']} cpus, load average {mach['load_average'][0]} -> {mach['load_average_end'][0]}")
    print("\n| measurement | value |\n|---|---:|")
    for label, key in rows:
        if isinstance(key, tuple):
            print(f"| {label} | {res[key[0]]:.2f} / {res[key[1]]:.2f} |")
        elif key in res:
            print(f"| {label} | {res[key]:.2f} |")
    print(f"\nwrote {save_results('batch', res)}")


if __name__ == "__main__":
    main()
