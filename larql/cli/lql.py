"""`larql lql` (LQL statements from the command line or a file, results as a table, JSON, CSV or
Markdown) and `larql repl` (the interactive shell, larql/shell/repl.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from larql.cli.common import result_printer


def cmd_lql(args: argparse.Namespace) -> int:
    from larql.lql.parser import parse
    from larql.lql.planner import plan
    from larql.lql.script import run_text
    from larql.lql.session import Session
    from larql.shell.progress import StatementProgress

    fmt = args.format or ("json" if args.json else "table")
    if args.json and fmt != "json":
        sys.stderr.write(f"larql: error: --json and --format {fmt} ask for different outputs; give one\n")
        return 2
    if (args.file is None) == (args.statements is None):
        sys.stderr.write("larql: error: give LQL statements or -f FILE (one of them)\n")
        return 2
    if args.file is not None:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except OSError as e:
            sys.stderr.write(f"larql: error: {args.file}: cannot read ({e.strerror})\n")
            return 1
    else:
        text = args.statements
    plain = fmt != "table"  # machine-readable: no colour, no progress bars
    sink = result_printer(fmt, width=args.width, timing=args.timing)
    bars = StatementProgress(enabled=not (plain or args.quiet or args.plan))
    session = Session(source=text, progress=bars.report)
    if args.vindex:
        from larql.edit.state.view import edit_vindex

        session.vindex = edit_vindex(args.vindex)
    if args.plan:
        for stmt in parse(text):
            print(plan(stmt, session).to_text())
        return 0
    run_text(text, session, sink, around=bars.statement)  # each statement's bars erased before its results print
    return 0


def cmd_repl(args: argparse.Namespace) -> int:
    from larql.shell.repl import run_repl

    return run_repl(args.vindex, json_output=args.json)


def add_commands(sub: argparse._SubParsersAction) -> None:
    lq = sub.add_parser("lql", help="run LQL statements: larql lql 'USE \"g.vindex\"; DESCRIBE \"France\";'")
    lq.add_argument("statements", nargs="?", help="one or more statements separated by ';'")
    lq.add_argument("-f", "--file", help="read the statements from a file")
    lq.add_argument("--vindex", help="USE this vindex before the statements")
    lq.add_argument("--plan", action="store_true", help="print each statement's plan instead of running it")
    lq.add_argument("--timing", action="store_true", help="print each statement's time")
    lq.add_argument("--width", type=int, default=None, help="table width (default: the terminal's)")
    lq.add_argument("--format", choices=["table", "json", "csv", "markdown"], default=None,
                    help="table (default), json (one object a result, as --json), csv (header and rows of each "
                         "result, values in full), markdown (title, pipe table, notes)")
    lq.set_defaults(func=cmd_lql)

    rp = sub.add_parser("repl", help="an interactive LQL shell (statements end with ';', .help for commands)")
    rp.add_argument("vindex", nargs="?", help="a vindex to USE at start")
    rp.set_defaults(func=cmd_repl)
