"""The README and the docs pages run as written.

- Every ```python block runs, in order, in one namespace per page (as a reader pasting a page's
  blocks into one session would), in a directory where `g.vindex` is the gemma3-270m vindex the
  suite extracts anyway. A line `EXPR  # => VALUE` (or `NAME = EXPR  # => VALUE`) shows its result,
  and the result is checked: equal, floats within 0.01.
- Every `larql ...` line of a ```bash block parses: its arguments with larql's own argument
  parser, and for `larql lql` its statements with the LQL parser.
- The `larql lql` lines that only read g.vindex, and the `larql run` lines, run for real. A bash
  block followed directly by a ```text title="output" block shows what its last command prints,
  and that output is checked (the same words; numbers within 0.1%).

The pages are README.md and docs/**/*.md (the file-format specs under vindex_spec/, which the site
shows as docs/vindex_spec, describe multi-machine set-ups with placeholder hosts and are not run).

Why a small collector and not pytest-markdown-docs or sybil: the blocks build on each other and
need the session's vindex in their working directory (a fixture), and the shell lines need
larql's own parsers; both tools run code blocks but neither checks a CLI line. This is ~90 lines.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted(p for p in (ROOT / "docs").rglob("*.md") if "vindex_spec" not in p.relative_to(ROOT).parts)]
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)  # the language, then any attributes


def blocks(lang: str, page: Path = README) -> list[tuple[int, str]]:
    """(line number, body) of every fenced block in `lang` on one page."""
    text = page.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 2, m.group(2)) for m in _FENCE.finditer(text) if m.group(1) == lang]


def shell_commands() -> list[tuple[str, list[str]]]:
    """Every `larql` (and `echo ... > file`) command of every page's bash blocks as argv, with its
    `page:line`, a command spanning lines (a quoted LQL script) joined, `# comments` dropped,
    `a && b` split."""
    out = []
    for page in PAGES:
        for start, body in blocks("bash", page):
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
                            out.append((f"{page.relative_to(ROOT)}:{first}", command))
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
            raise AssertionError(f"{line}: {shlex.join(argv)} does not parse") from e
        if args.command == "lql" and args.statements:
            assert parse(args.statements), line


@pytest.fixture(scope="module")
def readme_dir(gemma_vindex: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("readme")
    (d / "g.vindex").symlink_to(gemma_vindex)
    return d


_SHOWN = re.compile(r"^(?P<indent>\s*)(?:(?P<name>[A-Za-z_]\w*) = )?(?P<expr>.+?)\s+# => (?P<want>.+)$")


def _same(got: object, want: object) -> bool:
    if isinstance(want, float) and isinstance(got, (int, float)):
        return abs(float(got) - want) <= 0.01
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    return bool(got == want)


def _check_shown(got: object, want: str, where: str) -> None:
    import ast

    if hasattr(got, "tolist"):  # numpy scalars and arrays compare as Python values
        got = got.tolist()
    assert _same(got, ast.literal_eval(want)), f"{where}: shows {want}, got {got!r}"


def with_checks(body: str, page: Path, first: int) -> str:
    """`body` with every `EXPR  # => VALUE` line turned into a check of EXPR's value."""
    lines = body.splitlines()
    for i, line in enumerate(lines):
        m = _SHOWN.match(line)
        if m:
            where = f"{page.relative_to(ROOT)}:{first + i}"
            target = m["name"] or "_shown"
            lines[i] = (f"{m['indent']}{target} = {m['expr']}; "
                        f"_check_shown({target}, {m['want']!r}, {where!r})")
    return "\n".join(lines) + "\n"


SERVED = "http://127.0.0.1:8081"  # docs/guide/serving.md's `larql serve smollm2-135m --port 8081`


@pytest.mark.parametrize("page", [p for p in PAGES if blocks("python", p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run_as_written(page: Path, readme_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from larql.serve.server import ServerThread
    from larql.serve.sessions import open_served

    monkeypatch.chdir(readme_dir)
    namespace: dict[str, object] = {"__name__": "readme", "_check_shown": _check_shown}
    for line, body in blocks("python", page):
        body = with_checks(body, page, line)
        if SERVED in body:  # the OpenAI client block talks to the server the bash block above starts
            with ServerThread(open_served("smollm2-135m")) as url:  # a real one, on a free loopback port
                code = compile("\n" * (line - 1) + body.replace(SERVED, url), str(page), "exec")
                exec(code, namespace)
            continue
        code = compile("\n" * (line - 1) + body, str(page), "exec")  # tracebacks name the page's line
        exec(code, namespace)


_OUTPUT = re.compile(r'^```bash\n(.*?)^```\n+```text title="output"\n(.*?)^```', re.M | re.S)
_CELL = re.compile(r"[^\s\u2500-\u257f]+")  # words between spaces and box-drawing characters


def shown_outputs() -> dict[str, str]:
    """`page:line` of a bash block's last command -> the output block shown after it."""
    out = {}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in _OUTPUT.finditer(text):
            lines = m.group(1).rstrip("\n").splitlines()
            first = text[: m.start(1)].count("\n") + 1
            out[f"{page.relative_to(ROOT)}:{first + len(lines) - 1}"] = m.group(2)
    return out


def _same_output(got: str, want: str) -> bool:
    g, w = _CELL.findall(got), _CELL.findall(want)
    if len(g) != len(w):
        return False
    for a, b in zip(g, w):
        try:
            x, y = float(a.replace(",", "")), float(b.replace(",", ""))
        except ValueError:
            if a != b:
                return False
            continue
        if abs(x - y) > 1e-3 * max(abs(x), abs(y), 1.0):
            return False
    return True


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
    runnable, seen = [], set()
    for line, argv in shell_commands():  # a command two pages show (the install, the quick start) runs once
        if _reads_only(argv) and (argv[0] == "echo" or tuple(argv) not in seen):
            runnable.append((line, argv))
            seen.add(tuple(argv))
    assert len(runnable) >= 5
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}  # tables as wide as the shown outputs
    shown = shown_outputs()
    assert shown, "no output block was found"
    for line, argv in runnable:
        if argv[0] == "echo":  # echo TEXT > FILE: a file a later command reads
            (readme_dir / argv[-1]).write_text(" ".join(argv[1:-2]) + "\n")
            continue
        r = subprocess.run([sys.executable, "-m", "larql", *argv[1:]], cwd=readme_dir, capture_output=True,
                           text=True, timeout=900, env=env)
        assert r.returncode == 0, f"{line}: {shlex.join(argv)}\n{r.stderr}"
        assert r.stdout.strip(), f"{line} printed nothing"
        if line in shown:
            assert _same_output(r.stdout, shown.pop(line)), f"{line}: the output shown is not what it prints:\n{r.stdout}"
    assert not shown, f"output blocks after commands that do not run: {sorted(shown)}"
