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

from larql.errors import LarqlError
from larql.lql.complete import complete
from larql.shell.repl import run_repl, statement_complete


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


@pytest.mark.parametrize("word", ["exit", "exit;", "quit", "QUIT;", "\\q", "\\q;"])
def test_psql_words_leave(word: str) -> None:
    out = drive(f"{word}\rSTATS;\r")
    assert "no vindex in use" not in out and "...>" not in out  # left at once, no continuation prompt


def test_help_lists_every_statement_with_an_example() -> None:
    for typed in ("help\r", "help;\r", ".help\r"):
        out = drive(typed)
        assert 'DESCRIBE             DESCRIBE "France";' in out
        assert "WALK                 WALK \"The capital of France is\" TOP 5;" in out
        assert "not implemented yet" not in out and "MERGE                MERGE" in out
        assert ".timing [on|off]" in out
    out = drive(".help DESCRIBE\rhelp walk;\r.help nothing\r")
    assert 'syntax:  DESCRIBE "entity" [ALL LAYERS | SYNTAX | KNOWLEDGE | OUTPUT] [AT LAYER n]' in out
    assert "WALK: a per-layer feature scan" in out and "syntax:  WALK \"prompt\" [TOP n]" in out
    assert "no statement called 'nothing'; .help lists them all" in out


def test_reference_covers_every_statement_and_its_examples_parse() -> None:
    from larql.lql import ast
    from larql.lql.parser import parse
    from larql.lql.reference import STATEMENTS

    kinds = {type(parse(s.example)[0]) for s in STATEMENTS}
    every = {c for c in vars(ast).values() if isinstance(c, type) and issubclass(c, ast.Statement)
             and c not in (ast.Statement, ast.PipeStmt)}
    assert every - kinds == set()
    assert all(s.example.endswith(";") and s.syntax.startswith(s.name.split()[0]) for s in STATEMENTS)
    from larql.lql.reference import PIPE

    assert type(parse(PIPE[0])[0]) is ast.PipeStmt
    for text in ('SHOW LAYERS RANGE 0-1;', "SHOW ENTITIES 3;", "COMPACT;", 'WALK "a" LAYERS ALL;',
                 'INSERT INTO EDGES (entity, relation, target) VALUES ("a", "b", "c") MODE = COMPOSE;',
                 'MERGE "b.vlp" ON CONFLICT KEEP_TARGET;', 'EXTRACT MODEL "m" INTO "o.vindex" WITH WEIGHTS;'):
        parse(text)  # the other spellings the reference lists


def test_history_and_settings_paths(tmp_path: Path) -> None:
    from larql.shell.repl_config import history_path, load_settings, settings_path

    env = {"HOME": "/home/u"}
    assert history_path(env) == Path("/home/u/.local/state/larql/history")
    assert settings_path(env) == Path("/home/u/.config/larql/repl.toml")
    env = {"HOME": "/home/u", "XDG_STATE_HOME": "/x/state", "XDG_CONFIG_HOME": "relative/ignored"}
    assert history_path(env) == Path("/x/state/larql/history")
    assert settings_path(env) == Path("/home/u/.config/larql/repl.toml")
    assert history_path({**env, "LARQL_HISTORY": "/h"}) == Path("/h")
    assert settings_path({**env, "LARQL_CONFIG": "/c.toml"}) == Path("/c.toml")
    assert load_settings(tmp_path / "none.toml") == {}
    (tmp_path / "bad.toml").write_text("colour = true\n")
    with pytest.raises(LarqlError, match="unknown or non-boolean setting 'colour'; settings are json = true|false"):
        load_settings(tmp_path / "bad.toml")


def test_settings_file_and_history_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "repl.toml").write_text("timing = true\n")
    monkeypatch.setenv("LARQL_CONFIG", str(tmp_path / "repl.toml"))
    monkeypatch.setenv("LARQL_HISTORY", str(tmp_path / "sub" / "hist"))
    buf = io.StringIO()
    with create_pipe_input() as inp:
        inp.send_text("SHOW MODELS;\r\x04")
        run_repl(None, input=inp, output=DummyOutput(), console=Console(file=buf, width=120, no_color=True))
    assert " ms)" in buf.getvalue()  # timing on, from the settings file
    assert "SHOW MODELS;" in (tmp_path / "sub" / "hist").read_text()  # its directory was created


def test_entity_ranking_puts_entities_first() -> None:
    from larql.lql.complete import vocabulary_lookup

    vocab = {"\u2581the": 5, "\u2581The": 9, "\u2581France": 70, "\u2581france": 610, "\u2581frank": 40,
             "\u2581Frankfurt": 300, "\u2581Fr": 2, "\u2581Franc\u00e9": 900, "Francis": 1, "\u2581Th": 3}
    lookup = vocabulary_lookup(vocab)
    assert lookup("fr") == ["Fr", "France", "Frankfurt", "Francé", "frank", "france"]
    assert lookup("th") == ["Th", "The", "the"]  # " The" is more common lower-case: a sentence start
    assert lookup("x") == [] and lookup("fr", limit=2) == ["Fr", "France"]


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
    # a private tmux server (-L): a user's running server would start the REPL with its own
    # environment, and the REPL would write the user's real history file
    tmux = ["tmux", "-L", name]
    cmd = f"env LARQL_HISTORY={tmp_path / 'hist'} {sys.executable} -m larql repl {vx}"
    subprocess.run([*tmux, "new-session", "-d", "-s", name, "-x", "130", "-y", "50", cmd], env=env, check=True)
    try:
        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout

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
            subprocess.run([*tmux, "send-keys", "-t", name, *keys], check=True)
        s = wait_for("┃ layer")
        assert "...>" in s  # the continuation prompt of the two-line statement
        subprocess.run([*tmux, "send-keys", "-t", name, "C-d"], check=True)
        end = time.time() + 20
        while time.time() < end and subprocess.run([*tmux, "has-session", "-t", name]).returncode == 0:
            time.sleep(0.2)
        assert subprocess.run([*tmux, "has-session", "-t", name], capture_output=True).returncode != 0
        assert "SHOW LAYERS" in (tmp_path / "hist").read_text()  # history persisted
    finally:
        subprocess.run([*tmux, "kill-session", "-t", name], capture_output=True)


def test_ctrl_c_clears_the_line_not_the_session(vx: Path) -> None:
    out = drive('DESCRIBE "half-typed\x03STATS;\r', vx)
    assert "model weights" in out and "half-typed" not in out.split("Using:")[1]
