"""A real local Ray cluster for the grid tests, one per test module (two logical CPUs: this machine's
cores; the actors reserve half a CPU each), and the models they shard."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from larql.grid.cluster import Options
from tests.synthetic import TinySpec, tiny_vindex

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")

MIXTRAL = Path(__file__).resolve().parents[1] / "golden" / "architectures" / "mixtral"
SMALL = Options(cpus=0.5, timeout=120.0)  # four actors fit in the two CPUs


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def fresh_budget() -> Iterator[None]:
    """Room to repack in this process: a matrix runs on its repacked int8 copy or on the GGUF blocks by
    the process-wide budget left when it is first used, and the shards' fresh processes repack theirs,
    so the local model compared with them must be loaded fresh with room too (logits 1.5e-5 apart)."""
    import larql.quant.tensor as tensor

    kept = tensor._repack_budget[0]
    tensor._repack_budget[0] = 1 << 40
    try:
        yield
    finally:
        tensor._repack_budget[0] = kept


@pytest.fixture(scope="module")
def tiny_vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny four-layer inference-level vindex (Q8_0 weights), to edit."""
    return tiny_vindex(tmp_path_factory.mktemp("grid"), TinySpec("gemma3", n_layers=4, ffn=96), seed=2)
