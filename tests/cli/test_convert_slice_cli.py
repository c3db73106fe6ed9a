"""`larql convert` and `larql slice` end to end: every direction writes something that loads and
answers as its source did; bad requests fail in one line with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import larql
from tests.cli.conftest import larql as run

IDS = [5, 80, 81, 120, 7, 7, 9]


@pytest.fixture(scope="module")
def inference_vindex(tiny_gguf: Path) -> Path:
    r = run("convert", str(tiny_gguf), str(tiny_gguf.parent / "c.vindex"), "--quiet")
    assert r.returncode == 0, r.stderr
    assert "(vindex," in r.stderr
    return tiny_gguf.parent / "c.vindex"


def test_gguf_to_vindex_to_gguf_and_safetensors(tiny_gguf: Path, inference_vindex: Path, tmp_path: Path) -> None:
    want = larql.load(tiny_gguf).forward(IDS)
    assert json.loads((inference_vindex / "index.json").read_text())["extract_level"] == "inference"
    assert run("convert", str(inference_vindex), str(tmp_path / "back.gguf"), "--quiet").returncode == 0
    np.testing.assert_allclose(larql.load(tmp_path / "back.gguf").forward(IDS), want, rtol=0, atol=1e-5)
    r = run("convert", str(inference_vindex), str(tmp_path / "hf"), "--dtype", "f32", "--quiet")
    assert r.returncode == 0 and "(safetensors," in r.stderr, r.stderr
    np.testing.assert_allclose(larql.load(tmp_path / "hf").forward(IDS), want, rtol=0, atol=1e-4)
    r = run("convert", str(tiny_gguf), str(tmp_path / "hf2"), "--to", "safetensors", "--dtype", "f32", "--quiet")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "hf2" / "model.safetensors").read_bytes() == (tmp_path / "hf" / "model.safetensors").read_bytes()


@pytest.mark.parametrize(("args", "message"), [
    (["{v}", "{t}/x.vindex"], "is a vindex already: `larql slice` copies parts of it"),
    (["{g}", "{t}/x.gguf"], "convert writes GGUF from a vindex; extract one first"),
    (["{v}", "{t}/x.gguf", "--dtype", "f16"], "--dtype does not apply to GGUF output"),
    (["{g}", "{t}/x", "--patch", "p.vlp"], "--patch applies to a vindex source"),
])
def test_convert_refuses_clearly(tiny_gguf: Path, inference_vindex: Path, tmp_path: Path, args: list[str],
                                 message: str) -> None:
    r = run("convert", *[a.format(v=inference_vindex, g=tiny_gguf, t=tmp_path) for a in args])
    assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_convert_refuses_an_existing_output_without_force(inference_vindex: Path, tmp_path: Path) -> None:
    (tmp_path / "hf").mkdir()
    r = run("convert", str(inference_vindex), str(tmp_path / "hf"))
    assert r.returncode == 1 and "already exists" in r.stderr and "--force" in r.stderr
    assert run("convert", str(inference_vindex), str(tmp_path / "hf"), "--force", "--quiet").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"] and (tmp_path / "hf" / "config.json").is_file()


def test_slice_dry_run_and_preset(inference_vindex: Path, tmp_path: Path) -> None:
    r = run("slice", str(inference_vindex), str(tmp_path / "s.vindex"), "--preset", "server", "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert set(lines) == {"tokenizer", "embeddings", "gates", "down_meta", "ffn", "total"}
    assert "6 tensors" in lines["ffn"] and "not written (--dry-run)" in lines["total"]
    assert not (tmp_path / "s.vindex").exists()
    r = run("slice", str(inference_vindex), str(tmp_path / "s.vindex"), "--preset", "server")
    assert r.returncode == 0 and run("verify", str(tmp_path / "s.vindex")).returncode == 0
    r = run("lql", f'USE "{tmp_path / "s.vindex"}"; STATS')
    assert "tokenizer, embeddings, gates, down_meta, ffn" in r.stdout
    r = run("slice", str(inference_vindex), str(tmp_path / "t.vindex"), "--parts", "tokenizer,ffn")
    assert r.returncode == 1 and "--parts must include embeddings, gates, down_meta" in r.stderr
