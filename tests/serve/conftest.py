"""Servers for the serve tests: real uvicorn on a loopback port, in a thread of the test process,
over tiny seeded vindexes (browse level for DESCRIBE, inference level for INFER / TRACE / edits)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gguf
import pytest

from larql.serve.config import Limits, ServeConfig
from larql.serve.server import ServerThread
from larql.serve.sessions import open_served
from larql.vindex.extract import extract
from tests.synthetic import TinySpec, hf_weights, tiny_vindex, write_gguf

SPEC = TinySpec("gemma3", n_layers=4, ffn=96)


@pytest.fixture(scope="session")
def browse_vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("serve-browse")
    write_gguf(root / "m.gguf", SPEC, hf_weights(SPEC, seed=2), gguf.GGMLQuantizationType.Q8_0)
    return extract(root / "m.gguf", root / "b.vindex", level="browse")


@pytest.fixture(scope="session")
def infer_vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("serve-infer"), SPEC, seed=2, dtype="f16")


Serve = Callable[..., Any]


@pytest.fixture(scope="session")
def serve() -> Serve:
    """serve(vindex, root=..., **config) -> a context manager yielding the server's URL."""

    @contextmanager
    def start(src: Path, root: Path | None = None, limits: Limits | None = None, **kw: Any) -> Iterator[str]:
        config = ServeConfig(root=root or src.parent, limits=limits or Limits(), **kw)
        with ServerThread(open_served(src), config) as url:
            yield url

    return start


@pytest.fixture(scope="session")
def browse(serve: Serve, browse_vx: Path) -> Iterator[str]:
    """A read-only server of the browse-level vindex."""
    with serve(browse_vx) as url:
        yield url


@pytest.fixture(scope="session")
def infer(serve: Serve, infer_vx: Path) -> Iterator[str]:
    """A read-only server of the inference-level vindex."""
    with serve(infer_vx) as url:
        yield url
