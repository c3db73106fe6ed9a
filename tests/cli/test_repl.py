"""The REPL driven through prompt_toolkit's pipe input, and once in a real terminal through tmux."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

from larql.lql.complete import complete
from larql.repl import statement_complete, run_repl



@pytest.fixture(scope="module")
def vx(tiny_vindex: Path) -> Path:
    return tiny_vindex


def drive(keys: str, vindex: Path | None = None) -> str:
    buf = io.StringIO()
    with create_pipe_input() as inp:
        inp.send_text(keys + "\x04")  # Ctrl-D ends the session
        run_repl(str(vindex) if vindex else None, input=inp, output=DummyOutput(),
                 console=Console(file=buf, width=120, no_color=True), persistent_history=False)
    return buf.getvalue()


def test_statements_multiline_and_errors(vx: Path) -> None:
    out = drive('STATS;\rSHOW LAYERS\r0-1;\rDESCRIBE France;\r.json on\rSELECT * FROM FEATURES WHERE layer = 1 LIMIT 2;\r', vx)
    assert out.startswith("Using: ")
    assert "model weights" in out  # STATS ran
    assert "┃ layer" in out  # SHOW LAYERS ran after a newline inside the statement
    assert "LqlSyntaxError: 1:10: expected a quoted entity after DESCRIBE" in out  # the session went on
    assert '"columns": ["layer", "feature", "token", "also", "relation", "score"]' in out


def test_meta_commands() -> None:
    out = drive(".help\r.timing\r.nope\r.quit\rSTATS;\r")
    assert ".json [on|off]" in out and "timing on" in out
    assert "unknown command .nope" in out
    assert "no vindex in use" not in out  # .quit ended the loop before STATS


def test_accept_rule() -> None:
    assert statement_complete("STATS;") and statement_complete(".help") and statement_complete("  ")
    assert not statement_complete("DESCRIBE") and not statement_complete('WALK "a;')
    assert statement_complete('WALK "a;";  -- done') is False  # a comment after ';' keeps the line open
    assert statement_complete('WALK "a;";')


def test_completion(tmp_path: Path, vx: Path) -> None:
    assert [s.text for s in complete("SELECT * FROM ")] == ["EDGES", "ENTITIES", "FEATURES"]
    assert [s.text for s in complete("describe 'x' verb")] == ["VERBOSE"]
    assert "DESCRIBE" in [s.text for s in complete("STATS; DESC")]
    (tmp_path / "a.vindex").mkdir()
    got = complete('USE "a', cwd=str(tmp_path))
    assert [(s.text, s.kind) for s in got] == [("a.vindex/", "path")]
    ents = complete('DESCRIBE "Fr', entities=lambda p: ["France", "Frankfurt"])
    assert [(s.text, s.start) for s in ents] == [("France", 2), ("Frankfurt", 2)]


@pytest.mark.slow
def test_real_terminal_through_tmux(vx: Path, tmp_path: Path) -> None:
    assert shutil.which("tmux"), "tmux is needed for this test (apt-get install tmux)"
    name = f"larql-test-{os.getpid()}"
    env = {**os.environ, "LARQL_HISTORY": str(tmp_path / "hist"), "COLUMNS": "120", "NO_COLOR": "1",
           "PROMPT_TOOLKIT_NO_CPR": "1"}
    cmd = f"{sys.executable} -m larql repl {vx}"
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "130", "-y", "50", cmd], env=env, check=True)
    try:
        def screen() -> str:
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout

        def wait_for(text: str, timeout: float = 60) -> str:
            end = time.time() + timeout
            while time.time() < end:
                s = screen()
                if text in s:
                    return s
                time.sleep(0.2)
            raise AssertionError(f"{text!r} not on screen:\n{screen()}")

        wait_for("lql>")
        for keys in (["-l", "SHOW LAYERS"], ["Enter"], ["-l", "0-1\\;"], ["Enter"]):  # tmux spells ';' as \;
            subprocess.run(["tmux", "send-keys", "-t", name, *keys], check=True)
        s = wait_for("┃ layer")
        assert "...>" in s  # the continuation prompt of the two-line statement
        subprocess.run(["tmux", "send-keys", "-t", name, "C-d"], check=True)
        end = time.time() + 20
        while time.time() < end and subprocess.run(["tmux", "has-session", "-t", name]).returncode == 0:
            time.sleep(0.2)
        assert subprocess.run(["tmux", "has-session", "-t", name], capture_output=True).returncode != 0
        assert "SHOW LAYERS" in (tmp_path / "hist").read_text()  # history persisted
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


def test_ctrl_c_clears_the_line_not_the_session(vx: Path) -> None:
    out = drive('DESCRIBE "half-typed\x03STATS;\r', vx)
    assert "model weights" in out and "half-typed" not in out.split("Using:")[1]
