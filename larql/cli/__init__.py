"""The `larql` command line: argparse, one module per command group, each a thin shell over the
library (larql.lql, larql.vindex, larql.edit, larql.serve).

    parser.py     the parser and main(): errors to one line and an exit code
    options.py    the global options, the overview without a command, "did you mean", exit codes
    common.py     what the commands share: a progress display, "wrote X (N MB) in Ys", LQL result output
    run.py        larql run: generate, --top, or a chat (chat.py) without a prompt
    lql.py        larql lql and larql repl
    db.py         larql extract, verify, convert, slice (and LARQL's spellings of them)
    hub.py        larql pull and publish: vindexes through the Hugging Face Hub
    edit.py       larql crown, edit, memit, apply-patch, eval-edits
    build.py      larql build: a Vindexfile into a vindex
    bench.py      larql bench: the runtime benchmark (benchmark.py) beside llama.cpp
    serve.py      larql serve: its options; the server is larql/serve/
    ray_options.py  --ray, --ray-shards ...: the FFN on Ray actors, for larql run and larql serve
"""

from __future__ import annotations

from larql.cli.parser import main

__all__ = ["main"]
