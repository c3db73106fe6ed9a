"""LARQL's spellings of larql's commands: `extract-index`, `convert gguf-to-vindex X -o Y` (and
safetensors-to-vindex), `slice VINDEX -o OUT`. Each writes what the native spelling writes (the
same files, byte for byte by their sha256); a wrong use is refused in one line, nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import larql as run
from tests.synthetic import TinySpec, hf_weights, write_hf_dir


def written(vindex: Path) -> tuple[dict[str, Any], str]:
    """A vindex's file table (every file's size and sha256) and its extract level."""
    index = json.loads((vindex / "index.json").read_text())
    return index["files"], index["extract_level"]


def both(native: list[str], larqls: list[str]) -> None:
    for argv in (native, larqls):
        r = run(*argv, "--quiet")
        assert r.returncode == 0, (argv, r.stderr)


def test_extract_index_is_extract(tiny_gguf: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.vindex", tmp_path / "b.vindex"
    both(["extract", str(tiny_gguf), "-o", str(a), "--level", "inference"],
         ["extract-index", str(tiny_gguf), "-o", str(b), "--level", "inference"])
    assert written(a) == written(b) and written(b)[1] == "inference"
    overview = run().stdout  # accepted, not listed: the overview names each command once
    assert "extract-index" not in overview and "Commands: run, extract, lql" in overview


def test_gguf_to_vindex_is_convert_to_vindex(tiny_gguf: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.vindex", tmp_path / "b.vindex"
    both(["convert", str(tiny_gguf), str(a)], ["convert", "gguf-to-vindex", str(tiny_gguf), "-o", str(b)])
    assert written(a) == written(b) and "weights.bin" in written(b)[0]


def test_safetensors_to_vindex_is_convert_to_vindex(tmp_path: Path) -> None:
    spec = TinySpec("llama")
    hf = write_hf_dir(tmp_path / "hf", spec, hf_weights(spec, seed=5))
    a, b = tmp_path / "a.vindex", tmp_path / "b.vindex"
    both(["convert", str(hf), str(a), "--to", "vindex"],
         ["convert", "safetensors-to-vindex", str(hf), "-o", str(b)])
    assert written(a) == written(b) and written(b)[1] == "inference"


def test_slice_dash_o_is_slice(tiny_gguf: Path, tmp_path: Path) -> None:
    full = tmp_path / "full.vindex"
    assert run("convert", str(tiny_gguf), str(full), "--quiet").returncode == 0
    a, b = tmp_path / "a.vindex", tmp_path / "b.vindex"
    both(["slice", str(full), str(a), "--preset", "client"], ["slice", str(full), "-o", str(b), "--preset", "client"])
    assert written(a) == written(b) and "weights.bin" in written(b)[0]
    r = run("slice", str(full), "-o", str(tmp_path / "c.vindex"), "--preset", "browse", "--dry-run")
    assert r.returncode == 0 and "not written (--dry-run)" in r.stdout and not (tmp_path / "c.vindex").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["convert", "gguf-to-vindex", "{g}"], "convert gguf-to-vindex: no output given; larql convert gguf-to-vindex"),
    (["convert", "gguf-to-vindex"], "convert gguf-to-vindex: no source given"),
    (["convert", "gguf-to-vindex", "{t}", "-o", "{t}/x.vindex"], "gguf-to-vindex takes a .gguf file; for a model "
                                                                 "directory use larql convert safetensors-to-vindex"),
    (["convert", "safetensors-to-vindex", "{g}", "-o", "{t}/x.vindex"], "use larql convert gguf-to-vindex"),
    (["convert", "gguf-to-vindex", "{g}", "-o", "{t}/x", "--to", "gguf"], "writes a vindex, not --to gguf"),
    (["convert", "{g}", "{t}/x.vindex", "-o", "{t}/y.vindex"], "the output is given twice"),
    (["convert", "{g}"], "convert: no output given; larql convert SRC OUT"),
    (["slice", "{g}", "--preset", "browse"], "slice: no output given"),
    (["slice", "{g}", "{t}/x.vindex", "-o", "{t}/y.vindex", "--preset", "browse"], "the output is given twice"),
])
def test_wrong_uses_are_refused_in_one_line(tiny_gguf: Path, tmp_path: Path, args: list[str], message: str) -> None:
    r = run(*[a.format(g=tiny_gguf, t=tmp_path) for a in args])
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_convert_reads_a_vindex_larql_wrote(tiny_vindex: Path, tmp_path: Path) -> None:
    """`larql convert SRC OUT` writes a browse-level larql vindex (tests/larql_format.py
    writes LARQL's layout); USE of LARQL's own names the converter; its weights only with --level browse."""
    from larql.vindex.store import open_vindex
    from tests.larql_format import write_larql_vindex

    src = write_larql_vindex(tmp_path / "rust.vindex", open_vindex(tiny_vindex))
    r = run("lql", f'USE "{src}"; STATS')
    assert r.returncode == 1 and "a LARQL vindex" in r.stderr.splitlines()[0], r.stderr  # then where in the query
    assert f"larql convert {src} OUT.vindex" in r.stderr
    r = run("convert", str(src), str(tmp_path / "out.gguf"))
    assert r.returncode == 1 and "is a LARQL vindex: convert it to a larql vindex first" in r.stderr, r.stderr
    r = run("convert", str(src), str(tmp_path / "c.vindex"), "--quiet")
    assert r.returncode == 0, r.stderr
    r = run("lql", f'USE "{tmp_path / "c.vindex"}"; STATS')
    assert r.returncode == 0 and "browse" in r.stdout, r.stderr
    (src / "attn_weights.bin").write_bytes(b"\0" * 64)
    r = run("convert", str(src), str(tmp_path / "d.vindex"))
    assert r.returncode == 1 and "attn_weights.bin: browse level only" in r.stderr, r.stderr
    assert not (tmp_path / "d.vindex").exists()
    assert run("convert", str(src), str(tmp_path / "d.vindex"), "--level", "browse", "--quiet").returncode == 0
