"""`larql run` end to end in a subprocess: streaming, --top, --json, errors without tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import larql
from tests.conftest import golden


def test_run_json_on_real_model() -> None:
    ref = golden("gemma3-270m", "hf")[0]
    r = larql("run", "gemma3-270m", ref["prompt"], "--max-tokens", "6", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ids"] == ref["greedy24_ids"][:6]
    assert out["text"] == " the capital of the country of"


def test_run_streams_prompt_and_continuation(tiny_gguf: Path) -> None:
    r = larql("run", str(tiny_gguf), "abc", "--max-tokens", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("abc") and len(r.stdout) > 4


def test_top_k_table_and_json(tiny_gguf: Path) -> None:
    r = larql("run", str(tiny_gguf), "abc", "--top", "3", "--json")
    assert r.returncode == 0, r.stderr
    top = json.loads(r.stdout)["top"]
    assert [row["rank"] for row in top] == [1, 2, 3]
    assert top[0]["logit"] >= top[1]["logit"] >= top[2]["logit"]
    assert 0 < top[0]["prob"] <= 1
    table = larql("run", str(tiny_gguf), "abc", "--top", "3")
    assert table.returncode == 0 and "rank" in table.stdout and "prob" in table.stdout


@pytest.mark.parametrize("args, message", [
    (("run", "no-such-model", "hi"), "larql: error: no-such-model: not a model alias, an existing path or a Hugging Face Hub id"),
    (("run", "{tiny}", "hi", "--max-tokens", "500"), "exceed the context of 64"),
])
def test_errors_are_one_line_without_traceback(tiny_gguf: Path, args: tuple[str, ...], message: str) -> None:
    r = larql(*(a.replace("{tiny}", str(tiny_gguf)) for a in args))
    assert r.returncode == 1
    assert message in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""


def test_corrupt_file_error_and_debug_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "junk.gguf"
    bad.write_bytes(b"\x00" * 100)
    r = larql("run", str(bad), "hi")
    assert r.returncode == 1 and "junk.gguf: not a GGUF file" in r.stderr and "Traceback" not in r.stderr
    r = larql("--debug", "run", str(bad), "hi")
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_bad_arguments_exit_nonzero() -> None:
    r = larql("run", "gemma3-270m", "hi", "--max-tokens", "0")
    assert r.returncode == 2 and "--max-tokens must be at least 1" in r.stderr
