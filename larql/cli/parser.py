"""The `larql` command line: the parser (one module of this package per command group adds its
commands) and main(). Every LarqlError becomes one line on stderr and exit code 1; tracebacks
appear only with --debug."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from larql.cli.options import add_global_options, preflight
from larql.errors import LarqlError


def _threads(n: int | None) -> None:
    """Thread pools for numba, OpenMP and BLAS (main() has set them before numpy loaded; this
    resizes numba's pool when a command is called in-process after it started)."""
    from larql.threads import configure

    configure(n)


def build_parser() -> argparse.ArgumentParser:
    from larql.cli import bench, build, db, edit, hub, lql, run, serve

    parser = argparse.ArgumentParser(prog="larql", description="A language model as a database.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # the order `larql` lists the commands in
    run.add_commands(sub)
    db.add_extract(sub)
    lql.add_commands(sub)
    db.add_verify(sub)
    edit.add_commands(sub)
    db.add_commands(sub)
    hub.add_commands(sub)
    build.add_commands(sub)
    bench.add_commands(sub)
    serve.add_commands(sub)
    add_global_options(parser, sub)
    return parser


def _validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if getattr(args, "max_tokens", 1) < 1:
        parser.error("--max-tokens must be at least 1")
    if getattr(args, "top", 0) < 0:
        parser.error("--top must be positive")
    if not 0.0 < getattr(args, "top_p", 1.0) <= 1.0:
        parser.error("--top-p must be in (0, 1]")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (cli/options.py lists them)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    # an alias maps to its command's parser, whose prog ends with the command's own name
    commands = [name for name, p in sub.choices.items() if p.prog.split()[-1] == name]
    answered = preflight(argv, commands, [name for name in sub.choices if name not in commands])
    if answered is not None:
        return answered
    args = parser.parse_args(argv)
    _validate(args, parser)
    try:
        _threads(args.threads)  # before numpy and numba load: their pools read the environment once
    except ValueError as e:
        parser.error(str(e))
    try:
        return int(args.func(args))
    except LarqlError as e:
        if args.debug:
            raise
        from larql.errors import LqlError

        sys.stderr.write(f"larql: {type(e).__name__}: " if isinstance(e, LqlError) else "larql: error: ")
        sys.stderr.write(f"{e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
