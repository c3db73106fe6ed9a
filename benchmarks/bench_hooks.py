"""Hook overhead on gemma3-270m: no hooks, an empty hook spec, and capturing every hook point.

    python benchmarks/bench_hooks.py

Targets: an empty spec costs <= 2%; capturing everything <= 15%. Writes
benchmarks/results/hooks.json.
"""

from __future__ import annotations

import time

import numpy as np
from results_file import save_results


def best(fn, reps: int = 7) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    import larql

    m = larql.load("gemma3-270m")
    ids = m.tokenize("The history of the city begins with a small settlement on the river, " * 3)[:48]
    plain = best(lambda: m.forward(ids))
    empty = best(lambda: m.forward(ids, hooks={}))
    capture = best(lambda: m.run_with_cache(ids))

    def decode(hooks):  # type: ignore[no-untyped-def]
        return lambda: m.generate(ids[:8], max_new_tokens=16, stop_at_eos=False, hooks=hooks)

    d_plain, d_empty = best(decode(None), 3), best(decode({}), 3)
    rows = {"forward_48_tokens_ms": plain * 1e3, "empty_spec_overhead_pct": 100 * (empty / plain - 1),
            "capture_all_overhead_pct": 100 * (capture / plain - 1),
            "decode_16_tokens_ms": d_plain * 1e3, "decode_empty_spec_overhead_pct": 100 * (d_empty / d_plain - 1)}
    for k, v in rows.items():
        print(f"| {k} | {v:.1f} |")
    save_results("hooks", rows)


if __name__ == "__main__":
    main()
