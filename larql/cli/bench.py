"""`larql bench`: the runtime benchmark (larql/cli/benchmark.py) from the command line.

    larql bench [MODEL ...] [--prompt 256] [--decode 64] [--rounds 1] [--no-peers] [--out FILE]

Prints a speed table (docs/guide/performance.md) (with --json, the results as one JSON object). Without
llama-cpp-python it measures larql alone, says on stderr how to install the peer, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def cmd_bench(args: argparse.Namespace) -> int:
    from larql.cli.benchmark import LLAMA_CPP_INSTALL, MODELS, describe_run, run_bench, table

    if args.prompt < 16 or args.decode < 1 or args.rounds < 1:
        sys.stderr.write("larql: error: --prompt must be at least 16, --decode and --rounds at least 1\n")
        return 2

    def say(stage: str) -> None:
        if not (args.quiet or args.json):
            sys.stderr.write(f"measuring {stage}\n")

    result = run_bench(args.models or list(MODELS), args.prompt, args.decode, peers=not args.no_peers, progress=say,
                       rounds=args.rounds)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result))
    else:
        print(describe_run(result))
        print(table(result["engines"]))
    for key, why in result["peer_errors"].items():
        sys.stderr.write(f"larql: llama.cpp not measured on {key}: {why}\n")
    if result["llama_cpp"] is None and not args.no_peers:
        sys.stderr.write(f"larql: llama.cpp not measured: llama-cpp-python is not installed ({LLAMA_CPP_INSTALL})\n")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="prefill and decode tok/s of larql beside llama.cpp (if installed), "
                                     "as a speed table")
    b.add_argument("models", nargs="*", metavar="MODEL",
                   help="aliases, .gguf files or HF directories (default: gemma3-270m smollm2-135m)")
    b.add_argument("--prompt", type=int, default=256, metavar="N", help="prompt tokens for prefill (default 256)")
    b.add_argument("--decode", type=int, default=64, metavar="N", help="greedy decode steps (default 64)")
    b.add_argument("--rounds", type=int, default=1, metavar="N",
                   help="measure each engine N times in turn and print the medians (lowest-highest) (default 1)")
    b.add_argument("--no-peers", action="store_true", help="measure larql only, even if llama-cpp-python is installed")
    b.add_argument("--out", metavar="FILE", help="also write the results (machine included) as JSON to FILE")
    b.set_defaults(func=cmd_bench)
