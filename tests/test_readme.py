"""The README runs as written.

- Every ```python block runs, in order, in one namespace (as a reader pasting them into one session
  would), in a directory where `g.vindex` is the gemma3-270m vindex the suite extracts anyway.
- Every `larql ...` line of a ```bash block parses: its arguments with larql's own argument
  parser, and for `larql lql` its statements with the LQL parser.
- The `larql lql` lines that only read g.vindex, and the `larql run` lines, run for real.

Why a small collector and not pytest-markdown-docs or sybil: the blocks build on each other and
need the session's vindex in their working directory (a fixture), and the shell lines need
larql's own parsers; both tools run code blocks but neither checks a CLI line. This is ~80 lines.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(lang: str) -> list[tuple[int, str]]:
    """(line number, body) of every fenced block in `lang`."""
    text = README.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 2, m.group(2)) for m in _FENCE.finditer(text) if m.group(1) == lang]


def shell_commands() -> list[tuple[int, list[str]]]:
    """Every `larql` (and `echo ... > file`) command of the bash blocks as argv, a command spanning lines (a quoted LQL
    script) joined, `# comments` dropped, `a && b` split."""
    out = []
    for start, body in blocks("bash"):
        pending, first = "", 0
        for i, line in enumerate(body.splitlines()):
            if not pending and not line.strip():
                continue
            pending, first = (pending + "\n" + line, first) if pending else (line, start + i)
            try:
                words = shlex.split(pending, comments=True)
            except ValueError:  # an open quote: the command goes on on the next line
                continue
            pending = ""
            command: list[str] = []
            for w in [*words, "&&"]:
                if w == "&&":
                    if command and command[0] in ("larql", "echo"):
                        out.append((first, command))
                    command = []
                else:
                    command.append(w)
    return out


def test_every_larql_line_parses() -> None:
    from larql.cli.options import preflight
    from larql.cli.parser import build_parser
    from larql.lql.parser import parse

    COMMANDS = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices).choices

    commands = [(line, argv) for line, argv in shell_commands() if argv[0] == "larql"]
    assert len(commands) >= 25  # every block was read
    for line, argv in commands:
        if argv[1:] in ([], ["--version"]) or argv[1] == "lqk":  # the conventions block's own examples
            assert preflight(argv[1:], list(COMMANDS)) == (2 if argv[1:2] == ["lqk"] else None if argv[1:] else 0)
            continue
        try:
            args = build_parser().parse_args(argv[1:])
        except SystemExit as e:
            raise AssertionError(f"README.md:{line}: {shlex.join(argv)} does not parse") from e
        if args.command == "lql" and args.statements:
            assert parse(args.statements), f"README.md:{line}"


@pytest.fixture(scope="module")
def readme_dir(gemma_vindex: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("readme")
    (d / "g.vindex").symlink_to(gemma_vindex)
    return d


SERVED = "http://127.0.0.1:8081"  # the README's `larql serve smollm2-135m --port 8081`


def test_python_blocks_run_as_written(readme_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from larql.serve.server import ServerThread
    from larql.serve.sessions import open_served

    monkeypatch.chdir(readme_dir)
    namespace: dict[str, object] = {"__name__": "readme"}
    for line, body in blocks("python"):
        if SERVED in body:  # the OpenAI client block talks to the server the bash block above starts
            with ServerThread(open_served("smollm2-135m")) as url:  # a real one, on a free loopback port
                code = compile("\n" * (line - 1) + body.replace(SERVED, url), str(README), "exec")
                exec(code, namespace)
            continue
        code = compile("\n" * (line - 1) + body, str(README), "exec")  # tracebacks name the README's line
        exec(code, namespace)


def _reads_only(argv: list[str]) -> bool:
    """Commands cheap enough to run and that write nothing the next one would see (EXTRACT INTO
    "g.vindex" finds the same extraction there and reuses it)."""
    if argv[0] == "echo" or argv[1:] in ([], ["--version"]) or argv[1] == "verify":
        return True
    if argv[1] == "run":  # not placeholders, nor the chat (no prompt: it needs a terminal, tests/cli/test_chat.py)
        return not argv[2].startswith("path/") and len(argv) > 3 and not argv[3].startswith("-")
    writes = ("INSERT", "COMPILE", "APPLY", "CROWN", "BEGIN", "SAVE")
    # USE REMOTE needs the server the serving section starts by hand (tests/serve run one for real)
    return argv[1] == "lql" and len(argv) > 2 and not any(w in argv[2] for w in writes) and "USE REMOTE" not in argv[2]


def test_read_only_commands_run(readme_dir: Path) -> None:
    runnable = [(line, argv) for line, argv in shell_commands() if _reads_only(argv)]
    assert len(runnable) >= 5
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for line, argv in runnable:
        if argv[0] == "echo":  # echo TEXT > FILE: a file a later command reads
            (readme_dir / argv[-1]).write_text(" ".join(argv[1:-2]) + "\n")
            continue
        r = subprocess.run([sys.executable, "-m", "larql", *argv[1:]], cwd=readme_dir, capture_output=True,
                           text=True, timeout=900, env=env)
        assert r.returncode == 0, f"README.md:{line}: {shlex.join(argv)}\n{r.stderr}"
        assert r.stdout.strip(), f"README.md:{line} printed nothing"
