"""LQL parse throughput and per-statement executor overhead.

    python benchmarks/bench_lql.py

Target: 100 mixed statements parse in <= 20 ms. LARQL's Rust parser: 78 us for its mix.
Writes benchmarks/results/lql.json.
"""

from __future__ import annotations

import time
from pathlib import Path

from results_file import save_results

from larql.lql import parse

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "golden" / "lql" / "statements.lql"


def main() -> None:
    lines = [ln for ln in FIXTURES.read_text().splitlines() if ln.strip() and not ln.startswith("--")]
    mixed = ("\n".join(lines) + "\n") * 2
    statements = [s for s in mixed.split(";\n") if s.strip()][:100]
    text = ";\n".join(statements) + ";"
    parse(text)  # build the LALR tables once
    runs = []
    for _ in range(20):
        t0 = time.perf_counter()
        n = len(parse(text))
        runs.append(time.perf_counter() - t0)
    best, median = min(runs) * 1e3, sorted(runs)[len(runs) // 2] * 1e3
    t0 = time.perf_counter()
    for s in statements[:20]:
        parse(s)
    one_by_one = (time.perf_counter() - t0) / 20 * 1e6
    overhead_us = executor_overhead_us()
    print(f"| parse {n} mixed statements in one text | {median:.1f} ms (best {best:.1f}) | target <= 20 ms |")
    print(f"| executor overhead per statement (plan + dispatch + result, STATS) | {overhead_us:.0f} us | |")
    print(f"| parse one statement (own call) | {one_by_one:.0f} us | LARQL Rust: 78 us |")
    save_results("lql", {"statements": n, "median_ms": median, "best_ms": best, "single_us": one_by_one,
                         "executor_overhead_us": overhead_us})


def executor_overhead_us() -> float:
    """Run STATS (a handler that only reads index.json fields) on a tiny vindex, parse excluded."""
    import tempfile

    import gguf

    from larql.lql.executor import run_statement
    from larql.lql.session import Session
    from larql.vindex.extract import extract
    from larql.vindex.store import open_vindex

    sys_path = str(Path(__file__).resolve().parents[1])
    import sys

    if sys_path not in sys.path:
        sys.path.insert(0, sys_path)
    from tests.synthetic import TinySpec, hf_weights, write_gguf

    root = Path(tempfile.mkdtemp())
    write_gguf(root / "m.gguf", TinySpec("llama"), hf_weights(TinySpec("llama")), gguf.GGMLQuantizationType.Q8_0)
    session = Session(vindex=open_vindex(extract(root / "m.gguf", root / "t.vindex")))
    (stmt,) = parse("STATS")
    run_statement(stmt, session)
    t0 = time.perf_counter()
    for _ in range(200):
        run_statement(stmt, session)
    return (time.perf_counter() - t0) / 200 * 1e6


if __name__ == "__main__":
    main()
