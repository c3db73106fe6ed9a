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


def test_routes_table_lists_every_route_of_the_app() -> None:
    """The HTTP API table is rendered from the app's own route list (the OpenAI routes included), and
    a route without a description is reported."""
    spec = importlib.util.spec_from_file_location("render_docs", TOOL)
    assert spec and spec.loader
    render_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render_docs)
    from larql.serve.app import app_routes

    table, missing = render_docs.render_routes()
    assert missing == []
    for route in app_routes() + app_routes(ffn_only=True):
        assert f"`{getattr(route, 'path', '')}`" in table
    for path in ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings"):
        assert f"`{path}`" in table
    render_docs.ROUTES.pop("/v1/embeddings")
    assert "/v1/embeddings" in render_docs.render_routes()[1]


def test_every_cli_argument_has_its_help() -> None:
    """The CLI reference has no empty 'what' cell: every argument of every command says what it is."""
    import argparse

    from larql.cli.parser import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {a.option_strings or a.dest}" for name, sp in sub.choices.items() for a in sp._actions
               if not a.help]
    assert missing == []
