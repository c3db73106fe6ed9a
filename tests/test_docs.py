"""The generated docs are up to date: tools/render_docs.py --check (the CLI and LQL references, the
HTTP routes table and the results tables match their sources; every LARQL_* variable is documented;
every repository path and link the docs name exists; no development-round or issue numbers in the
docs, benchmarks, tools or tests, nor in results file names)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "render_docs.py"


def test_docs_are_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("render_docs", TOOL)
    assert spec and spec.loader
    render_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render_docs)
    code = render_docs.main(["--check"])
    assert code == 0, capsys.readouterr().err
