"""Entity completion in the REPL on gemma3-270m's vocabulary (262,144 tokens): the cost of each
keystroke inside quotes and how high the entity a user means ranks.

    python benchmarks/bench_completion.py

Types each entity of benchmarks/data/facts_gemma3_270m.json (and a few more) one character at a
time after `DESCRIBE "`, timing `complete()` per keystroke (the target: under 50 ms). Ranking: the
entity's position among the suggestions after its first 2 and 3 letters, with larql's ranking and
with the previous one (alphabetical). Writes benchmarks/results/completion.json.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from results_file import save_results

import larql
from larql.lql.complete import complete, vocabulary_lookup

FACTS = Path(__file__).parent / "data" / "facts_gemma3_270m.json"
EXTRA = ["Paris", "Berlin", "London", "Tokyo", "Einstein", "Shakespeare", "Microsoft", "Amazon", "Germany", "Italy"]


def alphabetical(ids: dict[str, int]):  # the plain alternative: sorted, filtered by prefix
    words = sorted({p[1:] for p in ids if p[:1] == "\u2581" and p[1:].isalpha() and len(p) > 3})
    return lambda partial: [w for w in words if w.lower().startswith(partial.lower())]


def rank(found: list[str], entity: str) -> int | None:
    return found.index(entity) + 1 if entity in found else None


def main() -> None:
    facts = json.loads(FACTS.read_text())["facts"]
    entities = sorted({f["entity"] for f in facts if " " not in f["entity"]} | set(EXTRA))
    ids = larql.load("gemma3-270m").tokenizer.tok.get_vocab()
    t0 = time.perf_counter()
    lookup = vocabulary_lookup(ids)
    build_s = time.perf_counter() - t0
    old = alphabetical(ids)
    times = []
    for e in entities:
        for n in range(1, len(e) + 1):
            t = time.perf_counter()
            complete(f'DESCRIBE "{e[:n]}', lookup)
            times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    ranks = {}
    for n in (2, 3):
        new = [rank(lookup(e[:n]), e) for e in entities]
        was = [rank(old(e[:n])[:50], e) for e in entities]
        ranks[n] = {"new_top10": sum(r is not None and r <= 10 for r in new),
                    "old_top10": sum(r is not None and r <= 10 for r in was),
                    "new_median": statistics.median([r or 51 for r in new]),
                    "old_median": statistics.median([r or 51 for r in was]), "n": len(entities)}
    out = {"build_s": round(build_s, 3), "keystrokes": len(times),
           "median_ms": round(times[len(times) // 2], 3), "p99_ms": round(times[int(len(times) * 0.99)], 3),
           "max_ms": round(times[-1], 3), "ranks": ranks}
    print(f"index build {build_s:.2f} s; {len(times)} keystrokes: median {out['median_ms']} ms, "
          f"p99 {out['p99_ms']} ms, max {out['max_ms']} ms")
    for n, r in ranks.items():
        print(f"after {n} letters: entity in the top 10 for {r['new_top10']}/{r['n']} (alphabetical: "
              f"{r['old_top10']}/{r['n']}); median rank {r['new_median']} (alphabetical {r['old_median']}, "
              f"51 = not in the first 50)")
    save_results("completion", out)


if __name__ == "__main__":
    main()
