"""`larql build` from the shell: a build, a cached rebuild, and errors in one line with exit 1."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import larql as run


def test_build_then_cached_rebuild(tiny_gguf: Path, tmp_path: Path) -> None:
    (tmp_path / "Vindexfile").write_text(f'FROM "{tiny_gguf}"\nDELETE layer = 0 AND feature = 1\nEXPOSE browse\n')
    r = run("build", str(tmp_path), "--quiet")
    assert r.returncode == 0, r.stderr
    assert "build.vindex" in r.stderr and "3 of 3 steps ran" in r.stderr
    assert (tmp_path / "build.vindex" / "index.json").is_file()
    r = run("build", str(tmp_path), "--quiet")
    assert r.returncode == 1 and "build.vindex: already exists; choose another --output or pass --force" in r.stderr
    r = run("build", str(tmp_path), "-o", str(tmp_path / "again.vindex"), "--quiet")
    assert r.returncode == 0 and "0 of 3 steps ran" in r.stderr, r.stderr


def test_a_typo_is_one_line_and_exit_1(tmp_path: Path) -> None:
    (tmp_path / "Vindexfile").write_text("FROM gemma3-270m\n# fine\n\nEXPOSE browse\nPACH x.vlp\n")
    r = run("build", str(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == 'larql: error: Vindexfile:5: unknown instruction "PACH"; did you mean PATCH?'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Vindexfile"]
