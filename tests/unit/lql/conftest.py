"""The tiny vindexes LQL's executor tests run on: one 4-layer seeded model, browse and inference level."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.synthetic import TinySpec, tiny_vindex

TINY = TinySpec("gemma3", n_layers=4, ffn=96)


@pytest.fixture(scope="module")
def vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("lqlx"), TINY, seed=2, level="browse", dtype="f16")


@pytest.fixture(scope="module")
def vxi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny model at the inference level (what INFER, TRACE, INSERT and CROWN need)."""
    return tiny_vindex(tmp_path_factory.mktemp("lqlxi"), TINY, seed=2, dtype="f16")
