"""CLI conventions: --version, global options before or after the command, the overview without a
command, "did you mean" for a mistyped one, and the documented exit codes (docs/troubleshooting.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from larql.version import __version__
from tests.cli.conftest import larql


def test_version() -> None:
    r = larql("--version")
    assert (r.returncode, r.stdout) == (0, f"larql {__version__}\n")


def test_no_command_prints_the_first_steps() -> None:
    r = larql()
    assert r.returncode == 0 and r.stderr == ""
    assert "larql extract gemma3-270m -o g.vindex --level inference" in r.stdout
    assert "larql repl g.vindex" in r.stdout
    assert "Commands: run, extract, lql, repl, verify" in r.stdout


def test_mistyped_command_suggests_the_nearest() -> None:
    r = larql("lqk", "STATS")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("larql: unknown command 'lqk'; did you mean 'lql'?")
    r = larql("--threads", "1", "extrct", "x")
    assert r.returncode == 2 and "did you mean 'extract'?" in r.stderr
    r = larql("zzzzzz")
    assert r.returncode == 2 and "did you mean" not in r.stderr and "commands: run, extract" in r.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_global_options_before_or_after_the_command(where: str, tiny_vindex: Path) -> None:
    opts = ["--json", "--quiet", "--threads", "1", "--debug"]
    stmt = f'USE "{tiny_vindex}"; SELECT layer FROM EDGES LIMIT 1'
    argv = [*opts, "lql", stmt] if where == "before" else ["lql", stmt, *opts]
    r = larql(*argv)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["columns"] == ["layer"]
    # --debug after the command shows the traceback of a LarqlError; without it, one line
    bad = larql("lql", 'DESCRIBE "France"', "--debug")
    assert bad.returncode == 1 and "Traceback" in bad.stderr
    assert "Traceback" not in larql("lql", 'DESCRIBE "France"').stderr


def test_exit_codes(tiny_vindex: Path) -> None:
    assert larql("lql", f'USE "{tiny_vindex}"; STATS').returncode == 0
    assert larql("lql", f'USE "{tiny_vindex}"; DESCRIBE France').returncode == 1  # larql refused
    assert larql("lql", "--no-such-option", "STATS").returncode == 2  # bad command line
    assert larql("run", "x", "y", "--threads", "0").returncode == 2
    r = larql("verify", str(tiny_vindex), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True
