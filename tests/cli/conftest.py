"""Shared helpers for CLI tests: run `python -m larql` in a subprocess; a tiny Q8_0 GGUF."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from tests.synthetic import TinySpec, hf_weights, write_gguf


def larql(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "larql", *args], capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    write_gguf(path, TinySpec("llama"), hf_weights(TinySpec("llama")), gguf.GGMLQuantizationType.Q8_0)
    return path


@pytest.fixture(scope="module")
def tiny_vindex(tiny_gguf: Path) -> Path:
    """A browse-level vindex of the tiny GGUF."""
    from larql.vindex.extract import extract

    return extract(tiny_gguf, tiny_gguf.parent / "t.vindex")
