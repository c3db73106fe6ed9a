"""What `larql lql` prints for a multi-statement script, in a terminal and in a pipe.

In a terminal (a real pseudo-terminal, 80 columns, its output replayed through the pyte terminal
emulator): each long statement shows progress while it runs, the progress is erased before its
results print, and no bar is left on the final screen; the "Using:" banner breaks between its
parts, never inside "model: ...". In a pipe or with --json: no progress, no escape codes.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pyte
import pytest

from tests.cli.conftest import larql


def script(tiny_gguf: Path, out: Path) -> str:
    return (f'EXTRACT MODEL "{tiny_gguf}" INTO "{out}"; STATS; WALK "abc" TOP 2 LAYERS 0-1; '
            f'SELECT layer, feature FROM EDGES LIMIT 2;')


def run_in_terminal(args: list[str], cwd: Path, columns: int = 80, rows: int = 300) -> tuple[bytes, list[str]]:
    """Run `python -m larql ARGS` on a pseudo-terminal; the raw bytes it wrote and the screen they leave."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "LARQL_PROGRESS_DELAY": "0", "COLUMNS": str(columns)}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "larql", *args], stdin=slave, stdout=slave, stderr=slave, env=env,
                            cwd=cwd)
    os.close(slave)
    raw = b""
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        raw += chunk
    proc.wait(timeout=60)
    os.close(master)
    screen = pyte.Screen(columns, rows)
    stream = pyte.ByteStream(screen)
    stream.feed(raw)  # the terminal turned "\n" into "\r\n" (onlcr), as a real one does
    assert proc.returncode == 0, raw.decode(errors="replace")
    return raw, [line.rstrip() for line in screen.display]


def test_terminal_shows_progress_then_erases_it_before_results(tiny_gguf: Path, tmp_path: Path) -> None:
    name = "a-vindex-with-a-rather-long-name.vindex"  # makes the "Using:" banner longer than 80 columns
    raw, screen = run_in_terminal(["lql", script(tiny_gguf, Path(name))], cwd=tmp_path)
    text = "\n".join(screen)
    spinner = "\u280b"  # rich's first spinner frame
    assert b"\x1b[" in raw  # a terminal: colour and cursor codes
    assert b"EXTRACT MODEL" in raw and spinner.encode() in raw and b"0:00:0" in raw  # progress was drawn
    assert "EXTRACT MODEL" not in text and spinner not in text and "0:00:0" not in text  # ... and erased
    order = [text.index(s) for s in ("Extraction complete", "Using: ", "STATS ", "Feature scan for 'abc'",
                                     "┃ layer ┃ feature ┃\n")]
    assert order == sorted(order)  # results in statement order
    assert all(len(line) <= 80 for line in screen)
    using = next(i for i, line in enumerate(screen) if line.startswith("  Using: "))
    # the banner is longer than 80 columns: it breaks between its parts, never inside "model: ..."
    first, second = screen[using], screen[using + 1]
    assert first == f"  Using: {name} (2 layers, 256 features,"
    assert second == "    model: tiny.gguf, level: browse)"


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_pipe_has_no_progress_and_no_escape_codes(tiny_gguf: Path, tmp_path: Path, flags: list[str]) -> None:
    env_delay = {**os.environ, "LARQL_PROGRESS_DELAY": "0"}
    r = subprocess.run([sys.executable, "-m", "larql", "lql", script(tiny_gguf, tmp_path / "t.vindex"), *flags],
                       capture_output=True, text=True, env=env_delay, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and "\x1b" not in r.stdout
    if flags:
        results = [json.loads(line) for line in r.stdout.splitlines()]
        assert [x["statement"].split()[0] for x in results] == ["EXTRACT", "STATS", "WALK", "SELECT"]
    else:
        assert r.stdout.index("Extraction complete") < r.stdout.index("STATS ") < r.stdout.index("Feature scan")


def test_quiet_extract_in_a_terminal_draws_no_bar(tiny_gguf: Path, tmp_path: Path) -> None:
    raw, screen = run_in_terminal(["extract", str(tiny_gguf), "-o", "q.vindex", "--quiet"], cwd=tmp_path)
    assert b"0:00:0" not in raw and any(line.startswith("wrote ") for line in screen)
    assert larql("verify", str(tmp_path / "q.vindex")).returncode == 0
