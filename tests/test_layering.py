"""Imports go one way: cli/repl -> lql -> (facade) -> edit -> vindex -> model -> quant, errors a leaf.
The facade (larql/__init__.py: load, open_vindex, edit_vindex) sits above edit, so the shells and
LQL may call it and nothing below may. Read from the source with ast, lazy imports included (an
import inside a function is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "larql"
# the layer of each part of larql, lowest first; a module may import its own layer and lower ones
ORDER = ["errors", "quant", "model", "vindex", "edit", "facade", "lql", "top"]
TOP = {"cli", "cli_core", "cli_chat", "cli_db", "cli_edit", "cli_build", "build", "shell", "__main__", "serve"}  # the shells above lql


LEAVES = {"version", "_lazy", "threads"}  # helpers anyone may import


def _layer(module: str) -> str | None:
    """'larql.vindex.store' -> 'vindex'; 'facade' for the package itself and names it defines;
    None outside larql and for the leaf helpers."""
    parts = module.split(".")
    if parts[0] != "larql":
        return None
    if len(parts) == 1:
        return "facade"
    head = parts[1]
    if head in LEAVES:
        return None
    if head in TOP:
        return "top"
    if head in ORDER:
        return head
    return "facade"  # `from larql import load`: a name of the facade


TOP |= {"bench", "cli_bench"}  # `larql bench` and the benchmark it runs
LEAVES |= {"io"}  # files and directories (larql/io/): the cache directory, JSON, path guard, temporaries


def _modules() -> list[tuple[str, str, bool]]:
    """(dotted name, source, is a package __init__) of every larql module."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append((".".join(parts), path.read_text(), path.name == "__init__.py"))
    return out


def _imports(module: str, source: str, is_package: bool = False) -> list[tuple[str, int]]:
    """(imported larql module or facade name, line) for every import in the source, at any depth."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base == "larql":  # `from larql import x`: a subpackage, a leaf or a facade name
                found += [(f"larql.{a.name}", node.lineno) for a in node.names]
            else:
                found.append((base, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] == "larql"]


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    mine = _layer(module)
    if mine is None:
        return []
    bad = []
    for target, line in _imports(module, source, is_package):
        theirs = _layer(target)
        if theirs is None or theirs == mine:
            continue
        if mine == "errors":
            bad.append(f"{module}:{line} imports {target}: errors.py is a leaf")
        elif ORDER.index(theirs) > ORDER.index(mine):
            bad.append(f"{module}:{line} ({mine}) imports {target} ({theirs}), a layer above it")
    return bad


def test_imports_go_one_way() -> None:
    bad = [v for module, source, is_package in _modules() for v in violations(module, source, is_package)]
    assert bad == []


@pytest.mark.parametrize("module, source", [
    ("larql.model.load", "def f():\n    from larql.vindex.store import open_vindex\n"),  # lazy counts too
    ("larql.model.ffn", "import larql.edit.overlay\n"),
    ("larql.vindex.browse", "from larql.edit.view import EditableVindex\n"),
    ("larql.vindex.extract", "import larql\n"),
    ("larql.vindex.extract", "from larql import load\n"),
    ("larql.edit.view", "from larql.lql import session\n"),
    ("larql.lql.planner", "from larql import cli\n"),
    ("larql.errors", "from larql.model import hooks\n"),
    ("larql", "from larql.lql import parse\n"),
    ("larql.vindex.knn", "from ..edit import overlay\n"),
])
def test_the_checker_sees_an_upward_import(module: str, source: str) -> None:
    assert violations(module, source) != []


@pytest.mark.parametrize("module, source", [
    ("larql.lql.session", "from larql.edit.view import EditableVindex\n"),
    ("larql.edit.view", "from larql.vindex import knn\nfrom larql.errors import VindexError\n"),
    ("larql.vindex.store", "from larql.model.tokenizer import TextTokenizer\n"),
    ("larql.cli", "from larql.lql.executor import run_statement\nimport larql\n"),
    ("larql.lql.ops.lifecycle", "from larql import load\n"),
    ("larql", "from larql.edit.view import edit_vindex\n"),
])
def test_the_checker_allows_downward_imports(module: str, source: str) -> None:
    assert violations(module, source) == []
