"""The facade: larql.load dispatches on what a path is, open_vindex / edit_vindex open a store or
an editable view, and nothing heavy loads before it is needed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import larql
from larql.errors import ModelFormatError, UnknownModelError
from tests.synthetic import TinySpec, tiny_vindex

ROOT = Path(__file__).resolve().parents[1]
IDS = [5, 80, 81, 120, 7]


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a new interpreter importing this checkout's larql."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


@pytest.fixture(scope="module")
def vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("facade"), TinySpec("llama", n_layers=2, ffn=96), seed=3)


def test_import_and_opening_a_store_load_no_numba(vx: Path) -> None:
    code = (f"import sys, larql; assert 'numpy' not in sys.modules, 'import larql loaded numpy'\n"
            f"v = larql.open_vindex({str(vx)!r}); v.down_meta(0); v.feature_meta(1, 3); v.gate_knn(0, v.entity_embedding('a'), 3)\n"
            f"e = larql.edit_vindex({str(vx)!r}); e.feature_meta(1, 3)\n"
            f"assert 'numba' not in sys.modules, sorted(m for m in sys.modules if m.startswith('larql'))\n"
            f"print('ok')")
    r = _fresh(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_parsing_and_planning_load_no_numba(vx: Path) -> None:
    code = (f"import sys\nfrom larql.cli import main\n"
            f"main(['lql', '--vindex', {str(vx)!r}, '--plan', 'DESCRIBE \"France\"; INFER \"a b\" TOP 3; "
            f"INSERT INTO EDGES (entity, relation, target) VALUES (\"a\", \"b\", \"c\");'])\n"
            f"assert 'numba' not in sys.modules\nprint('ok')")
    r = _fresh(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr
    assert "PLAN INFER" in r.stdout


def test_load_dispatches_on_the_path(vx: Path) -> None:
    walk = larql.load(vx)  # a vindex: the walk FFN over an editable view
    gguf_model = larql.load(vx.parent / "m.gguf")
    assert walk.edits is not None and gguf_model.edits is None
    assert np.array_equal(walk.forward(IDS), gguf_model.forward(IDS))
    assert isinstance(larql.open_vindex(vx), larql.Vindex)
    view = larql.edit_vindex(vx)
    assert isinstance(view, larql.EditableVindex) and view.store.path == vx
    assert view.model().edits is not None and len(view.overlay) == 0
    with pytest.raises(UnknownModelError, match="not a model alias, an existing path or a Hugging Face Hub id"):
        larql.load(vx.parent / "missing.gguf")
    from larql.model.load import load as load_model

    with pytest.raises(ModelFormatError, match="not a model directory"):
        load_model(vx)  # model/ does not open vindexes: only the facade knows them
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        larql.nothing  # noqa: B018


def test_every_public_name_resolves() -> None:
    for name in larql.__all__:
        assert getattr(larql, name) is not None, name
    assert issubclass(larql.EditError, larql.LarqlError) and larql.hooks.Zero and larql.interp.logit_lens


def _python_of(path: Path) -> str:
    """The Python a user copies from `path`: a script, or a Markdown file's ```python blocks."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return text
    return "\n".join(block.split("```", 1)[0] for block in text.split("```python")[1:])


def test_the_readme_the_docs_and_the_examples_use_only_the_public_api() -> None:
    """What a user copies imports `larql` and the names it gives, never a module inside it."""
    deep = re.compile(r"^\s*(from larql\.\w|import larql\.\w)", re.M)
    pages = sorted((ROOT / "docs").rglob("*.md"))
    for path in [ROOT / "README.md", *pages, *sorted((ROOT / "examples").glob("*.py"))]:
        found = [m.group(0).strip() for m in deep.finditer(_python_of(path))]
        assert not found, (path.name, found)


def test_the_browsing_verbs_are_methods_of_a_store_and_a_view(vx: Path) -> None:
    from larql.vindex import browse
    from larql.vindex.describe import describe

    for v in (larql.open_vindex(vx), larql.edit_vindex(vx)):
        assert v.walk("a b c", top=3) == browse.walk(v, "a b c", 3)
        assert v.nearest("a b", layer=1, limit=4) == browse.nearest(v, "a b", 1, 4)
        assert v.describe("a b", probes=False) == describe(v, "a b", probes=False)


def test_a_view_inserts_and_a_model_finds_its_crown(vx: Path) -> None:
    from larql.edit.insert import insert_facts
    from larql.model.crown import find_crown

    fact = larql.Fact("zeta", "Colour of zeta", "blue", "colour")
    v, w = larql.edit_vindex(vx), larql.edit_vindex(vx)
    report = v.insert(fact, "neuron", measure=False)
    same = insert_facts(w, [fact], "neuron", measure=False)
    assert isinstance(report, larql.InsertReport) and report.method == "neuron" and report.layers == same.layers
    ids = v.model().tokenize("Colour of zeta")
    assert np.array_equal(v.model().forward(ids), w.model().forward(ids))  # the method is the function
    assert not np.array_equal(v.model().forward(ids), v.model().dense().forward(ids))  # and it edited
    m = v.model().dense()
    assert m.crown("Colour of zeta", "blue", "zeta") == find_crown(m, "Colour of zeta", "blue", "zeta")


def test_execute_and_parse_are_the_lql_entry_points(vx: Path) -> None:
    from larql.lql.executor import execute
    from larql.lql.session import Session

    text = f'USE "{vx}"; WALK "a b c" TOP 3;'
    assert [type(s).__name__ for s in larql.parse(text)] == ["UseStmt", "WalkStmt"]
    ours, theirs = larql.execute(text, larql.Session())[-1], execute(text, Session())[-1]
    assert isinstance(ours, larql.Result) and ours.rows == theirs.rows and ours.rows


def test_import_larql_sets_the_thread_pools_as_the_cli_does() -> None:
    """A script gets the CLI's thread settings; a variable the user set stays as they set it."""
    code = ("import json, os; import larql; "
            "print(json.dumps({k: os.environ.get(k) for k in ('NUMBA_NUM_THREADS', 'OMP_NUM_THREADS', 'GOMP_SPINCOUNT')}))")
    from larql.threads import SPIN_COUNT, available_cores

    got = json.loads(_fresh(code).stdout)
    assert got == {"NUMBA_NUM_THREADS": str(available_cores()), "OMP_NUM_THREADS": str(available_cores()),
                   "GOMP_SPINCOUNT": str(SPIN_COUNT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert json.loads(r.stdout)["OMP_NUM_THREADS"] == "1"
