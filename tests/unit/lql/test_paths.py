"""Where LQL writes: never into, over or around the vindex (or model) it reads, whatever the path
looks like (symbolic links, '..', FORCE), and never over an existing output without FORCE."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from larql.edit.patches.patch import Patch, save_patch
from larql.errors import LqlSemanticError, VindexError
from larql.lql.executor import execute
from larql.lql.session import Session
from larql.vindex.store import open_vindex


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (and beside it) with its sha256: what must not change."""
    return {str(p.relative_to(root.parent)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.parent.rglob("*"))}


def refused(text: str, match: str, session: Session | None = None) -> LqlSemanticError:
    with pytest.raises(LqlSemanticError, match=match) as e:
        execute(text, session)
    assert e.value.line >= 1 and e.value.column >= 1
    return e.value


def test_no_statement_writes_into_the_vindex_in_use(vxi: Path, tmp_path: Path) -> None:
    before = snapshot(vxi)
    link = tmp_path / "link"
    link.symlink_to(vxi)
    dotdot = f"{vxi}/../{vxi.name}"  # the same directory by a longer road
    gguf = vxi.parent / "m.gguf"  # the model the vindex was extracted from
    use = f'USE "{vxi}"; '
    cases = [
        (f'COMPILE CURRENT INTO VINDEX "{vxi}" FORCE', "is the vindex in use"),
        (f'COMPILE CURRENT INTO VINDEX "{dotdot}" FORCE', "is the vindex in use"),
        (f'COMPILE CURRENT INTO VINDEX "{link}" FORCE', "is the vindex in use"),
        (f'COMPILE CURRENT INTO VINDEX "{vxi}/sub.vindex"', "is inside the vindex in use"),
        (f'COMPILE CURRENT INTO VINDEX "{vxi.parent}" FORCE', "holds the vindex in use"),
        (f'COMPILE CURRENT INTO MODEL "{vxi}/m.gguf" FORMAT GGUF', "is inside the vindex in use"),
        (f'COMPILE CURRENT INTO MODEL "{gguf}" FORMAT GGUF FORCE', "is the model .* was extracted from"),
        (f'COMPILE CURRENT INTO MODEL "{link}/hf" FORMAT SAFETENSORS', "is inside the vindex in use"),
        (f'COMPILE "{vxi}" INTO VINDEX "{dotdot}" FORCE', "is the vindex in use"),
        (f'BEGIN PATCH "{vxi}/edits.vlp" FORCE', "is inside the vindex in use"),
        (f'BEGIN PATCH "{link}/edits.vlp"', "is inside the vindex in use"),
        (f'BEGIN PATCH "{dotdot}/index.json" FORCE', "is inside the vindex in use"),
        (f'DIFF CURRENT "{vxi}" INTO PATCH "{vxi}/d.vlp" FORCE', "is inside the vindex in use"),
        (f'TRACE "a b" POSITIONS ALL SAVE "{link}/t.trace" FORCE', "is inside the vindex in use"),
        (f'EXTRACT MODEL "{gguf}" INTO "{vxi}" FORCE', "is the vindex in use"),
        (f'EXTRACT MODEL "{gguf}" INTO "{link}/x.vindex" FORCE WITH INFERENCE', "is inside the vindex in use"),
    ]
    for stmt, match in cases:
        e = refused(use + stmt, match)
        assert e.line == 1 and e.column == len(use) + 1, stmt  # located at the statement
        assert "read-only" in str(e) or "would delete" in str(e)
    # a vindex a statement reads is guarded too, with no vindex in use
    refused(f'COMPILE "{vxi}" INTO VINDEX "{link}" FORCE', "is a vindex this statement reads")
    refused(f'DIFF "{vxi}" "{vxi}" INTO PATCH "{vxi}/x.vlp" FORCE', "is inside a vindex this statement reads")
    # the model EXTRACT reads
    refused(f'EXTRACT MODEL "{gguf}" INTO "{gguf}" FORCE', "is the model this statement reads")
    assert snapshot(vxi) == before
    open_vindex(vxi)  # still opens and verifies


def test_existing_outputs_are_replaced_only_with_force(vxi: Path, tmp_path: Path) -> None:
    use = f'USE "{vxi}"; '
    out = tmp_path / "c.vindex"
    execute(use + f'COMPILE CURRENT INTO VINDEX "{out}"')
    inode = out.stat().st_ino
    refused(use + f'COMPILE CURRENT INTO VINDEX "{out}"', "c.vindex: already exists; add FORCE")
    assert out.stat().st_ino == inode
    execute(use + f'COMPILE CURRENT INTO VINDEX "{out}" FORCE')
    assert out.stat().st_ino != inode and open_vindex(out).num_layers == 4

    for name, fmt in (("m.gguf", "GGUF"), ("hf", "SAFETENSORS")):
        target = tmp_path / name
        target.write_text("keep me") if fmt == "GGUF" else (target.mkdir(), (target / "keep").write_text("me"))
        refused(use + f'COMPILE CURRENT INTO MODEL "{target}" FORMAT {fmt}', f"{name}: already exists; add FORCE")
        assert (target.read_text() if fmt == "GGUF" else (target / "keep").read_text()) in ("keep me", "me")
        execute(use + f'COMPILE CURRENT INTO MODEL "{target}" FORMAT {fmt} FORCE')
        assert (target.stat().st_size > 1000) if fmt == "GGUF" else (target / "config.json").is_file()

    patch = tmp_path / "p.vlp"
    patch.write_text("keep me")
    e = refused(use + f'BEGIN PATCH "{patch}"', "p.vlp: already exists; add FORCE")
    assert f'BEGIN PATCH "{patch}" FORCE' in str(e)  # the hint is the statement to write
    refused(use + f'DIFF CURRENT "{vxi}" INTO PATCH "{patch}"', "already exists; add FORCE")
    assert patch.read_text() == "keep me"
    execute(use + f'DIFF CURRENT "{vxi}" INTO PATCH "{patch}" FORCE')
    assert '"operations": []' in patch.read_text()

    trace = tmp_path / "t.trace"
    trace.write_text("keep me")
    refused(use + f'TRACE "a b" POSITIONS ALL SAVE "{trace}"', "already exists; add FORCE")
    assert trace.read_text() == "keep me"
    execute(use + f'TRACE "a b" POSITIONS ALL SAVE "{trace}" FORCE')
    assert trace.stat().st_size > 100

    # EXTRACT: an existing file is refused; a vindex of the same extraction is reused, another one
    # (other options) refused without FORCE and replaced with it
    gguf = vxi.parent / "m.gguf"
    refused(f'EXTRACT MODEL "{gguf}" INTO "{trace}"', "already exists; add FORCE")
    (_reused,) = execute(f'EXTRACT MODEL "{gguf}" INTO "{out}" WITH INFERENCE')[:1]
    assert open_vindex(out).index["extract_level"] == "inference"
    (_other,) = execute(f'EXTRACT MODEL "{gguf}" INTO "{tmp_path / "b.vindex"}"')[:1]
    refused(f'EXTRACT MODEL "{gguf}" INTO "{tmp_path / "b.vindex"}" WITH INFERENCE', "holds a different vindex")
    execute(f'EXTRACT MODEL "{gguf}" INTO "{tmp_path / "b.vindex"}" WITH INFERENCE FORCE')
    assert open_vindex(tmp_path / "b.vindex").index["extract_level"] == "inference"


def test_save_patch_refuses_a_file_that_appeared_since_begin(vx: Path, tmp_path: Path) -> None:
    session = Session()
    patch = tmp_path / "p.vlp"
    execute(f'USE "{vx}"; BEGIN PATCH "{patch}"; DELETE FROM EDGES WHERE layer = 1 AND feature = 2', session)
    patch.write_text("someone else's")
    refused("SAVE PATCH", "p.vlp: already exists; add FORCE", session)
    assert patch.read_text() == "someone else's"
    (saved,) = execute("SAVE PATCH FORCE", session)  # the edits were kept: nothing is lost
    assert "1 operations" in saved.title and '"op": "delete"' in patch.read_text()
    # BEGIN PATCH ... FORCE carries to SAVE PATCH
    execute(f'BEGIN PATCH "{patch}" FORCE; DELETE FROM EDGES WHERE layer = 1 AND feature = 3; SAVE PATCH', session)
    assert '"feature": 3' in patch.read_text()


def test_writers_never_clobber_without_overwrite(vx: Path, tmp_path: Path) -> None:
    """The writers check again when they rename: a file that appears after the plan is kept."""
    target = tmp_path / "x.vlp"
    target.write_text("first")
    with pytest.raises(VindexError, match="already exists"):
        save_patch(Patch("x.vlp", target, []), target)
    assert target.read_text() == "first" and sorted(os.listdir(tmp_path)) == ["x.vlp"]  # no temp left
    save_patch(Patch("x.vlp", target, []), target, overwrite=True)
    assert '"operations": []' in target.read_text()


def test_a_symbolic_link_loop_is_an_error_not_a_crash(vx: Path, tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(LqlSemanticError):  # the writer cannot create it: one located line
        execute(f'USE "{vx}"; BEGIN PATCH "{tmp_path}/a/p.vlp"; SAVE PATCH')
