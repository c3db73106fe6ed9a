"""DESCRIBE quality and latency on gemma3-270m against the fact table in benchmarks/data.

    python benchmarks/bench_describe.py [--vindex g.vindex]

A fact counts as surfaced when DESCRIBE "entity" has an edge whose target starts with the fact's
target (case-insensitive); for probe edges the relation must match too. Reported three ways: raw
LARQL-style feature edges, contrastive feature edges, and the full card (contrastive + probes).
Writes benchmarks/results/describe.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import larql.threads

# the thread pools as the CLI sets them, before numpy loads: on a busy machine OpenBLAS's
# busy-waiting threads slow DESCRIBE several times over (threads.py)
larql.threads.configure()

from results_file import save_results  # noqa: E402

FACTS = Path(__file__).parent / "data" / "facts_gemma3_270m.json"


def surfaced(edges, fact: dict) -> bool:  # type: ignore[no-untyped-def]
    target = fact["target"].lower()
    for e in edges:
        if e.target.lower().startswith(target) and (e.source != "probe" or e.label == fact["relation"]):
            return True
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vindex", help="an inference-level gemma3-270m vindex (extracted if omitted)")
    args = parser.parse_args()
    import larql
    from larql.vindex.describe import describe
    from larql.vindex.extract import extract
    from larql.vindex.store import open_vindex

    path = args.vindex
    if path is None:
        path = extract("gemma3-270m", Path(tempfile.mkdtemp()) / "g.vindex", level="inference")
    v = open_vindex(path)
    model = larql.load(path)  # probe edges ask the model the vindex carries
    facts = json.loads(FACTS.read_text())["facts"]
    rows, counts, times = [], {"raw": 0, "contrastive": 0, "full": 0}, []
    for fact in facts:
        raw = describe(v, fact["entity"], probes=False, contrastive=False)
        con = describe(v, fact["entity"], probes=False)
        t0 = time.perf_counter()
        full = describe(v, fact["entity"], model=model)
        times.append(time.perf_counter() - t0)
        hit = {"raw": surfaced(raw.edges, fact), "contrastive": surfaced(con.edges, fact), "full": surfaced(full.edges, fact)}
        for key, ok in hit.items():
            counts[key] += ok
        rows.append({**fact, **hit})
        print(f"{'+' if hit['full'] else '-'} {fact['entity']:16s} {fact['relation']:11s} {fact['target']:14s} "
              f"raw={int(hit['raw'])} contrastive={int(hit['contrastive'])} full={int(hit['full'])}")
    n = len(facts)
    t0 = time.perf_counter()
    describe(v, "France", probes=False)
    feature_only_ms = (time.perf_counter() - t0) * 1e3
    print(f"\nfacts surfaced by DESCRIBE (of {n}): raw feature edges {counts['raw']}, "
          f"contrastive feature edges {counts['contrastive']}, with probe edges {counts['full']}")
    print(f"latency: feature edges only {feature_only_ms:.0f} ms; full card with probes "
          f"median {sorted(times)[n // 2] * 1e3:.0f} ms")
    out = save_results("describe", {"n": n, "surfaced": counts, "feature_only_ms": feature_only_ms,
                                     "full_median_ms": sorted(times)[n // 2] * 1e3, "facts": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
