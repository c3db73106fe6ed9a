"""The import rule of larql, checked on the source with ast (a lazy import inside a function, and one
under TYPE_CHECKING, is still a dependency):

1. layers, lowest first: the leaves (errors, version, threads, io/) < quant < model < vindex < edit <
   grid < lql < the facade (larql/__init__.py) < the shells (cli/, shell/, serve/, vindexfile/); a module
   imports its own layer and lower ones, never a higher one;
2. no import cycle between larql modules, in any layer;
3. no private name (`_x`) of one module used by another: imported, or read as an attribute of an
   imported module.

Every part of larql has a layer here; a new top-level module or package must be given one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "larql"

# the parts of larql by layer, lowest first; "larql" is the facade (the package's own __init__)
LAYERS: list[tuple[str, set[str]]] = [
    ("leaf", {"errors", "version", "threads", "io"}),
    ("quant", {"quant"}),
    ("model", {"model"}),
    ("vindex", {"vindex"}),
    ("edit", {"edit"}),
    ("grid", {"grid"}),
    ("lql", {"lql"}),
    ("facade", {""}),
    ("shells", {"cli", "shell", "serve", "vindexfile", "__main__"}),
]
RANK = {part: rank for rank, (_, parts) in enumerate(LAYERS) for part in parts}


def layer(module: str) -> int:
    """The rank of a module's layer: 'larql.vindex.store' -> 3; 'larql' (the facade) -> 6."""
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else ""
    if head not in RANK:
        raise KeyError(f"{module}: larql/{head} has no layer in tests/test_layering.py LAYERS")
    return RANK[head]


def _is_module(dotted: str, root: Path, known: set[str]) -> bool:
    if dotted in known:
        return True
    rel = Path(*dotted.split(".")[1:]) if "." in dotted else Path()
    base = root / rel
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


Modules = list[tuple[str, str, bool]]  # (dotted name, source, is a package __init__)


class Imports:
    """What one module takes from the rest of larql: (module, line) for every import, and
    (module, name, line) for every private name it imports or reads off an imported module."""

    def __init__(self, module: str, source: str, is_package: bool, root: Path, known: set[str]) -> None:
        self.modules: list[tuple[str, int]] = []
        self.private: list[tuple[str, str, int]] = []
        package = module if is_package else module.rpartition(".")[0]
        bound: dict[str, str] = {}  # local name -> the larql module it is bound to
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self._add(a.name, node.lineno)
                    if a.asname:
                        bound[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against the importing package
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                if base.split(".")[0] != "larql":
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if _is_module(sub, root, known):  # `from larql.lql import parser`: the submodule
                        self._add(sub, node.lineno)
                        bound[a.asname or a.name] = sub
                    else:
                        self._add(base, node.lineno)
                        if _private(a.name):
                            self.private.append((base, a.name, node.lineno))
        for node in ast.walk(tree):  # `parser._lark()` on a module imported above
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
                target = bound.get(node.value.id)
                if target is not None:
                    self.private.append((target, node.attr, node.lineno))

    def _add(self, name: str, line: int) -> None:
        if name.split(".")[0] == "larql":
            self.modules.append((name, line))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def sources(root: Path = PACKAGE) -> Modules:
    """(dotted name, source, is a package __init__) of every larql module."""
    out = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append((".".join(parts), path.read_text(), path.name == "__init__.py"))
    return out


def _imports(modules: Modules, root: Path) -> list[tuple[str, Imports]]:
    known = {m for m, _, _ in modules}
    return [(m, Imports(m, source, is_package, root, known)) for m, source, is_package in modules]


def upward(modules: Modules, root: Path = PACKAGE) -> list[str]:
    bad = []
    for module, imports in _imports(modules, root):
        for target, line in imports.modules:
            if layer(target) > layer(module):
                bad.append(f"{module}:{line} imports {target}, a layer above it")
    return bad


def private_names(modules: Modules, root: Path = PACKAGE) -> list[str]:
    return [f"{module}:{line} uses {name} of {target}: make it public where it lives, or move it"
            for module, imports in _imports(modules, root) for target, name, line in imports.private if target != module]


def cycles(modules: Modules, root: Path = PACKAGE) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for module, imports in _imports(modules, root):
        graph.setdefault(module, set()).update(t for t, _ in imports.modules if t != module)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_every_module_has_a_layer() -> None:
    missing = []
    for module, _, _ in sources():
        try:
            layer(module)
        except KeyError as e:
            missing.append(str(e))
    assert missing == []


def test_no_upward_import() -> None:
    assert upward(sources()) == []


def test_no_import_cycle() -> None:
    assert cycles(sources()) == []


def test_no_private_name_across_modules() -> None:
    assert private_names(sources()) == []


# the checker itself, on small made-up modules


@pytest.mark.parametrize("module, source", [
    ("larql.model.load", "def f():\n    from larql.vindex.store import open_vindex\n"),  # lazy counts too
    ("larql.model.ffn", "import larql.edit.patches.overlay\n"),
    ("larql.vindex.browse", "from larql.edit.state.view import EditableVindex\n"),
    ("larql.vindex.extract", "import larql\n"),
    ("larql.vindex.extract", "from larql import load\n"),
    ("larql.edit.state.view", "from larql.lql import session\n"),
    ("larql.lql.planner", "from larql.cli import main\n"),
    ("larql.errors", "from larql.model import hooks\n"),
    ("larql.io.jsonfile", "from larql.quant.types import GGMLType\n"),
    ("larql", "from larql.cli import main\n"),
    ("larql.lql.planner", "import larql\n"),
    ("larql.vindex.knn", "from ..edit import overlay\n"),
    ("larql.model.model", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from larql.vindex.store import Vindex\n"),
])
def test_the_checker_sees_an_upward_import(module: str, source: str) -> None:
    assert upward([(module, source, False)]) != []


@pytest.mark.parametrize("module, source", [
    ("larql.lql.session", "from larql.edit.state.view import EditableVindex\n"),
    ("larql.edit.state.view", "from larql.vindex import knn\nfrom larql.errors import VindexError\n"),
    ("larql.vindex.store", "from larql.model.tokenizer import TextTokenizer\n"),
    ("larql.cli.parser", "from larql.lql.executor import run_statement\nimport larql\n"),
    ("larql.shell.repl", "from larql.io.cachedir import cache_dir\n"),
    ("larql", "from larql.edit.state.view import edit_vindex\n"),
])
def test_the_checker_allows_downward_imports(module: str, source: str) -> None:
    assert upward([(module, source, False)]) == []


def test_the_checker_sees_a_cycle() -> None:
    two = [("larql.vindex.store", "from larql.vindex import knn\n", False),
           ("larql.vindex.knn", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    from larql.vindex.store import Vindex\n", False)]
    assert cycles(two) == [["larql.vindex.knn", "larql.vindex.store"]]
    three = [("larql.cli.a", "from larql.cli import b\n", False), ("larql.cli.b", "import larql.cli.c\n", False),
             ("larql.cli.c", "def f():\n    from .a import x\n", False)]
    assert cycles(three) == [["larql.cli.a", "larql.cli.b", "larql.cli.c"]]
    assert cycles(two[:1] + three[:2]) == []


@pytest.mark.parametrize("source", [
    "from larql.lql.parser import _lark\n",
    "from larql.lql import parser\nparser._lark()\n",
    "import larql.lql.parser as p\np._lark()\n",
    "def f():\n    from ..edit.scoring import _log_softmax\n",
])
def test_the_checker_sees_a_private_name(source: str) -> None:
    assert private_names([("larql.vindex.verify", source, False)]) != []


def test_the_checker_allows_public_and_own_names() -> None:
    assert private_names([("larql.vindex.verify", "from larql.lql.parser import lark_parser\n"
                                                  "from larql.version import __version__\n", False),
                          ("larql.lql.parser", "def _lark(): ...\n_lark()\n", False)]) == []


def test_every_package_lists_its_modules() -> None:
    """Each package's docstring names each of its modules and sub-packages: the folder listing, read
    from the package's own first page, is the design."""
    missing = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        parts = [p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"]
        parts += [p.name for p in init.parent.iterdir() if (p / "__init__.py").is_file()]
        missing += [f"{init.parent.relative_to(PACKAGE.parent)}/{name}" for name in parts if name not in doc]
    assert not missing, missing
