"""Session fixtures: the two real models, their golden references, and small synthetic models."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

import larql
from tests.synthetic import TinySpec, hf_weights, write_gguf, write_hf_dir

# trimmed copies of ../shared/golden kept in the repository (tools/vendor_golden.py); LARQL_GOLDEN overrides
GOLDEN = Path(os.environ.get("LARQL_GOLDEN", Path(__file__).resolve().parent / "golden" / "reference"))
# the prompts whose activations (and the one whose full logits) the references hold
ACTIVATION_PROMPTS = 2
LOGITS_PROMPT = 1
REAL_MODELS = ("gemma3-270m", "smollm2-135m")


def pytest_configure(config: pytest.Config) -> None:
    """Keep the REPL's history and settings, in this process and every subprocess the tests start,
    away from the user's real files (~/.local/state/larql, ~/.config/larql, $LARQL_HISTORY)."""
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="larql-test-home-"))
    os.environ.update({"LARQL_HISTORY": str(home / "history"), "LARQL_CONFIG": str(home / "repl.toml"),
                       "XDG_STATE_HOME": str(home / "state"), "XDG_CONFIG_HOME": str(home / "config")})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden files from current output")


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def golden(key: str, engine: str) -> list[dict]:
    return json.loads((GOLDEN / f"{key}.{engine}.json").read_text())["prompts"]


@pytest.fixture(scope="session", params=REAL_MODELS)
def real_model(request: pytest.FixtureRequest) -> larql.Model:
    return larql.load(request.param)


@pytest.fixture(scope="session")
def gemma() -> larql.Model:
    return larql.load("gemma3-270m")


@pytest.fixture(scope="session")
def gemma_vindex(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma 3 270M extracted at the inference level (about a minute, once per run)."""
    from larql.vindex.extract import extract

    return extract("gemma3-270m", tmp_path_factory.mktemp("real") / "g.vindex", level="inference")


@pytest.fixture(scope="session")
def smollm2_vindex(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M extracted at the inference level (once per run)."""
    from larql.vindex.extract import extract

    return extract("smollm2-135m", tmp_path_factory.mktemp("real") / "s.vindex", level="inference")


@pytest.fixture(scope="session", params=["llama", "gemma3"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny seeded model as an HF directory and as F32 and Q8_0 GGUF files."""
    spec = TinySpec(arch=request.param)
    weights = hf_weights(spec, seed=7)
    root = tmp_path_factory.mktemp(f"tiny-{spec.arch}")
    f32_held = write_gguf(root / "f32.gguf", spec, weights)
    q8_held = write_gguf(root / "q8.gguf", spec, weights, gguf.GGMLQuantizationType.Q8_0)
    write_hf_dir(root / "hf", spec, weights)
    return {"spec": spec, "weights": weights, "root": root, "f32_held": f32_held, "q8_held": q8_held}


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(np.asarray(b, np.float64)))
