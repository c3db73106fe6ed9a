"""The write rule outside LQL too: `larql slice`, `convert`, `extract`, `build` and the COMPILE
writers never write into, over or around (a directory holding) what they read, FORCE or not; and
MERGE, which reads a path, obeys LQL's path rules locally and when served."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import typing
from pathlib import Path

import gguf
import pytest

from larql.edit.bake.compile import compile_gguf, compile_safetensors, compile_vindex
from larql.edit.bake.convert import convert
from larql.edit.state.view import edit_vindex
from larql.errors import LarqlError, LqlError, LqlSemanticError
from larql.lql import ast
from larql.lql.executor import execute
from larql.lql.parser import parse
from larql.lql.session import Session
from larql.serve import guard
from larql.vindex.extract import extract
from larql.vindex.slice import slice_vindex
from larql.vindexfile.run import build
from tests.synthetic import TinySpec, hf_weights, write_gguf

SPEC = TinySpec("gemma3", n_layers=2, ffn=32)


@pytest.fixture(scope="module")
def vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("guard")
    write_gguf(root / "m.gguf", SPEC, hf_weights(SPEC, seed=4), gguf.GGMLQuantizationType.F32)
    return extract(root / "m.gguf", root / "t.vindex", level="inference")


def snapshot(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def test_slice_compile_convert_and_extract_never_write_their_input(vx: Path, tmp_path: Path) -> None:
    root, gguf_path = vx.parent, vx.parent / "m.gguf"
    patch = tmp_path / "p.vlp"
    patch.write_text('{"version": 1, "operations": []}')
    before = snapshot(root) | snapshot(tmp_path)
    v = edit_vindex(vx)
    cases = [
        (lambda: slice_vindex(vx, vx, preset="browse", overwrite=True), "is the vindex being sliced"),
        (lambda: slice_vindex(vx, vx / "sub.vindex", preset="browse"), "is inside the vindex being sliced"),
        (lambda: slice_vindex(vx, root, preset="browse", overwrite=True), "holds the vindex being sliced"),
        (lambda: slice_vindex(vx, gguf_path, preset="browse", overwrite=True), "is the model .* was extracted from"),
        (lambda: compile_vindex(v, vx / "c.vindex"), "is inside the vindex compiled"),
        (lambda: compile_safetensors(v, root, overwrite=True), "holds the vindex compiled"),
        (lambda: compile_gguf(v, gguf_path, overwrite=True), "is the model .* was extracted from"),
        (lambda: convert(vx, vx / "hf"), "is inside the source converted"),
        (lambda: convert(vx, patch, to="safetensors", patches=[patch], overwrite=True), "is a patch it applies"),
        (lambda: convert(gguf_path, gguf_path, to="vindex", overwrite=True), "is the source converted"),
        (lambda: convert(gguf_path, root, to="safetensors", overwrite=True), "holds the source converted"),
        (lambda: extract(gguf_path, root, overwrite=True), "holds the model extracted"),
    ]
    for call, message in cases:
        with pytest.raises(LarqlError, match=message) as e:
            call()
        assert "\n" not in str(e.value)
    assert snapshot(root) | snapshot(tmp_path) == before  # nothing written, nothing removed, no temporaries


def test_build_never_replaces_its_recipe_cache_or_source(vx: Path, tmp_path: Path) -> None:
    d = tmp_path / "proj"
    d.mkdir()
    (d / "Vindexfile").write_text(f'FROM "{vx}"\n')
    before = snapshot(tmp_path) | snapshot(vx)
    for out, message in ((d, "is the build directory"), (tmp_path, "holds the build directory"),
                         (vx, "is the FROM source"), (vx / "o.vindex", "is inside the FROM source"),
                         (d / ".larql-build" / "o.vindex", "is inside the build cache")):
        with pytest.raises(LarqlError, match=message):
            build(d, out, force=True)
    assert {k: h for k, h in (snapshot(tmp_path) | snapshot(vx)).items() if ".larql-build" not in k} == before
    assert build(d, d / "ok.vindex").output.is_dir()  # the default place: inside the recipe's directory


def test_merge_obeys_the_path_rules(vx: Path, tmp_path: Path) -> None:
    s = Session()
    execute(f'USE "{vx}"', s)
    before = snapshot(vx.parent)
    with pytest.raises(LqlSemanticError, match="MERGE ... INTO is not supported"):  # MERGE never writes a file
        execute(f'MERGE "{vx}" INTO "{vx}"', s)
    os.mkfifo(tmp_path / "fifo.vlp")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for source, message in (("/dev/zero", "not a regular file, so not a patch"),
                            (tmp_path / "fifo.vlp", "not a regular file, so not a patch"),
                            (tmp_path, "a directory without index.json"),
                            (tmp_path / "a" / "p.vlp", "no such file or vindex"),
                            ("x" * 300, "longer than 240 bytes")):
        with pytest.raises(LqlError, match=message) as e:
            execute(f'MERGE "{source}"', s)
        assert e.value.line == 1 and e.value.column >= 1
    assert len(s.vindex.overlay) == 0 and snapshot(vx.parent) == before


def test_merge_paths_are_anchored_when_served(tmp_path: Path) -> None:
    root = tmp_path / "served"
    root.mkdir()
    (root / "link.vlp").symlink_to(tmp_path / "outside.vlp")

    def check(text: str) -> list[ast.Statement]:
        return guard.check_request(parse(text), text, root=root, allow_edits=True, token=None, bearer=None)[0]

    (merged,) = check('MERGE "theirs.vlp" ON CONFLICT FAIL')
    assert merged.source == str(root.resolve() / "theirs.vlp")
    for text in ('MERGE "../outside.vlp"', f'MERGE "{tmp_path}/outside.vlp"', 'MERGE "link.vlp"',
                 'MERGE "theirs.vlp" INTO "../x.vindex"', 'MERGE "sub/../../outside.vindex"'):
        with pytest.raises(LqlSemanticError, match="outside the server's directory"):
            check(text)


# the str fields of statements that name files, and those that do not: a new field must be put in
# one or the other, so that a server anchors every path a statement names
PATH_NAMES = {"path", "into", "save", "into_patch", "a", "b", "model", "labels"}
NAMED_PATHS = {(ast.CompileStmt, "source"), (ast.MergeStmt, "source"), (ast.UseStmt, "target")}
NOT_PATHS = {"level", "target", "format", "on_conflict", "dtype", "relation", "kind", "prompt", "layers", "mode",
             "entity", "band", "fields", "source", "for_token", "positions", "columns", "rows", "method", "expected",
             "subject", "components",
             "sae"}  # SAE "x" FEATURE n names an attached SAE (its USE SAE path or hook point), as DROP SAE does
ON_THE_STACK = {(ast.RemovePatchStmt, "path")}  # REMOVE PATCH names a patch on the stack, not a file


def test_every_path_a_statement_names_is_anchored_when_served() -> None:
    checked = 0
    for cls in vars(ast).values():
        if not (isinstance(cls, type) and issubclass(cls, ast.Statement)) or cls is ast.Statement:
            continue
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name == "span" or "str" not in str(hints[f.name]):
                continue
            assert f.name in PATH_NAMES | NOT_PATHS, f"{cls.__name__}.{f.name}: a path or not? classify it here"
            if (f.name in PATH_NAMES or (cls, f.name) in NAMED_PATHS) and (cls, f.name) not in ON_THE_STACK:
                checked += 1
                assert f.name in guard.PATH_FIELDS.get(cls, ()) or cls in guard.ELSEWHERE, (cls.__name__, f.name)
    assert checked == 16
