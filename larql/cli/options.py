"""The argument-parsing core of `larql`: global options, the overview shown without a command,
"did you mean" for a mistyped one, and the exit codes.

Global options are accepted before or after the subcommand (`larql --debug lql ...` and
`larql lql --debug ...`): each subparser gets a copy whose default is SUPPRESS, so a subcommand that
does not see the option leaves the value the top-level parser set.

Exit codes (docs/troubleshooting.md lists them):
    0    success
    1    larql refused or failed: a LarqlError (bad input, a damaged file, a failed check)
    2    the command line is wrong (unknown command or option, a bad value)
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any

from larql.version import __version__

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# (flags, argparse keywords, default) of every global option
GLOBAL_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any], Any], ...] = (
    (("--debug",), {"action": "store_true", "help": "show the full traceback of an error"}, False),
    (("--json",), {"action": "store_true",
                   "help": "machine-readable output (JSON where the command has it); never progress bars or colour"},
     False),
    (("--quiet", "-q"), {"action": "store_true", "help": "no progress bars"},
     False),
    (("--threads",), {"type": int, "metavar": "N",
                      "help": "worker threads for numba, OpenMP and BLAS (default: $LARQL_THREADS, else every "
                              "available core, BLAS on one when the machine is busy)"}, None),
)

FIRST_STEPS = """\
larql {version}: a language model as a database.

First steps:
  larql extract gemma3-270m -o g.vindex --level inference   # decompile the bundled model (about a minute)
  larql repl g.vindex                                       # then query it: DESCRIBE "France";

Commands: {commands}
`larql COMMAND --help` shows one command's options; `larql --help` the global ones.
"""


def add_global_options(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:
    """Give the top-level parser and every subparser the global options.

    Call after every subcommand is added. A subparser that already defines one of the flags keeps its
    own (so a subcommand added elsewhere cannot make the parser fail to build).
    """
    parser.add_argument("--version", action="version", version=f"larql {__version__}")
    top = parser.add_argument_group("global options (before or after the command)")
    for flags, kwargs, default in GLOBAL_OPTIONS:
        top.add_argument(*flags, default=default, **kwargs)
    for subparser in sub.choices.values():
        group = subparser.add_argument_group("global options")
        for flags, kwargs, _ in GLOBAL_OPTIONS:
            # argparse has no public "is this flag taken"; _option_string_actions is stable since 2.7
            free = tuple(f for f in flags if f not in subparser._option_string_actions)
            if free:
                group.add_argument(*free, default=argparse.SUPPRESS, **kwargs)


def _command_word(argv: Sequence[str]) -> str | None:
    """The first argument that is not a global option or its value: the subcommand as typed."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--threads":
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def preflight(argv: Sequence[str], commands: Sequence[str], aliases: Sequence[str] = ()) -> int | None:
    """Handle a missing or mistyped command before argparse would, with a friendlier message.
    `aliases` (LARQL's names of some commands) are accepted but not listed.

    Returns an exit code when it has answered, None when argparse should go on.
    """
    if any(a in ("-h", "--help", "--version") for a in argv):
        return None
    word = _command_word(argv)
    if word is None:
        sys.stdout.write(FIRST_STEPS.format(version=__version__, commands=", ".join(commands)))
        return EXIT_OK
    if word not in commands and word not in aliases:
        close = difflib.get_close_matches(word, commands, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        sys.stderr.write(f"larql: unknown command {word!r}; {hint}commands: {', '.join(commands)}\n")
        return EXIT_USAGE
    return None
