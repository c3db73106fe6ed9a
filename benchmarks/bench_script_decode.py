"""Decode speed from a Python script against `larql run`: the same model, prompt and greedy tokens,
each in a fresh process, alternated round by round.

    python benchmarks/bench_script_decode.py [--model gemma3-270m] [--tokens 64] [--rounds 5]

The CLI's figure is `larql run --json`'s decode_tokens_per_second; the script's is the same measure
taken around `larql.load(...).stream(...)` after `import larql`, with nothing else set: whatever
`import larql` configures (the thread pools) is what a script gets. Writes
benchmarks/results/script-decode.json with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from results_file import save_results

from larql.cli.benchmark import machine

PROMPT = "The capital of France is"
SCRIPT = """
import json, sys, time
import larql
m = larql.load(sys.argv[1])
ids, first = [], None
for tok, _ in m.stream(m.tokenize(sys.argv[2]), max_new_tokens=int(sys.argv[3]), temperature=0):
    first = first or time.perf_counter()
    ids.append(tok)
end = time.perf_counter()
print(json.dumps({"ids": ids, "decode_tokens_per_second": (len(ids) - 1) / (end - first)}))
"""


def run_json(argv: list[str]) -> dict[str, object]:
    r = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cli_argv = [sys.executable, "-m", "larql", "run", args.model, PROMPT, "--max-tokens", str(args.tokens), "--json"]
    script_argv = [sys.executable, "-c", SCRIPT, args.model, PROMPT, str(args.tokens)]
    run_json(cli_argv)  # a warm-up: numba's cache is filled before anything is timed
    cli, script = [], []
    for _ in range(args.rounds):
        a, b = run_json(cli_argv), run_json(script_argv)
        if a["ids"] != b["ids"]:
            raise SystemExit("the script and the CLI generated different tokens")
        cli.append(float(a["decode_tokens_per_second"]))  # type: ignore[arg-type]
        script.append(float(b["decode_tokens_per_second"]))  # type: ignore[arg-type]
    out = {"machine": machine(), "model": args.model, "tokens": args.tokens, "rounds": args.rounds,
           "cli_tokens_per_second": cli, "script_tokens_per_second": script,
           "cli_median": round(statistics.median(cli), 2), "script_median": round(statistics.median(script), 2),
           "script_over_cli": round(statistics.median(script) / statistics.median(cli), 3)}
    print(f"decode {args.model}: larql run {out['cli_median']} tok/s, a script {out['script_median']} tok/s "
          f"(x{out['script_over_cli']})")
    print(f"wrote {save_results('script-decode', out)}")


if __name__ == "__main__":
    main()
