"""The facade: larql.load dispatches on what a path is, open_vindex / edit_vindex open a store or
an editable view, and nothing heavy loads before it is needed."""

from __future__ import annotations

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
