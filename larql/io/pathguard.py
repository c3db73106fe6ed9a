"""Whether writing a path would touch what the writer reads: the one rule behind LQL's path checks
(lql/paths.py) and the commands that write outside LQL (`larql slice`, `convert`, `build`,
`extract`), so that none of them writes into, over, or around (a directory holding) its input.

Paths are compared as the file system sees them: symbolic links and '..' resolved, and by device
and inode, so another name for the same directory is the same directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def _ids(p: Path) -> list[tuple[Path, tuple[int, int]]]:
    """(path, (device, inode)) for `p` and each of its ancestors that exists."""
    out = []
    for a in (p, *p.parents):
        try:
            st = os.stat(a)
        except OSError:
            continue
        out.append((a, (st.st_dev, st.st_ino)))
    return out


def resolve(p: Path) -> Path:
    """`p` absolute, symbolic links and '..' resolved (a link loop: resolved as far as it goes)."""
    try:
        return p.expanduser().resolve()
    except (RuntimeError, OSError):  # a symbolic link loop (RuntimeError before Python 3.13)
        return Path(os.path.abspath(p.expanduser()))


def relation(target: Path, guard: Path) -> str | None:
    """How writing `target` touches `guard`: "is", "inside" or "contains" it, or None."""
    t, g = resolve(target), resolve(guard)
    if t == g:
        return "is"
    if g in t.parents:
        return "inside"
    if t in g.parents:
        return "contains"
    try:  # the same directory under another name (a bind mount, a case-insensitive file system)
        gst = os.stat(g)
    except OSError:
        return None
    gid = (gst.st_dev, gst.st_ino)
    for a, aid in _ids(t):
        if aid == gid:
            return "is" if a == t else "inside"
    tid = dict(_ids(t)).get(t)
    if tid is not None and any(aid == tid for _, aid in _ids(g)[1:]):
        return "contains"
    return None


def overlap(target: str | Path, reads: Iterable[tuple[str | Path, str]],
            allow_inside: bool = False) -> str | None:
    """The one-line reason writing `target` is refused (it is, is inside, or holds one of `reads`,
    given as (path, what it is)), or None. `allow_inside`: writing inside a read directory is fine
    (a build's default output sits in its recipe's directory)."""
    for guard, what in reads:
        how = relation(Path(target), Path(guard))
        if how is None or (how == "inside" and allow_inside):
            continue
        return {"is": f"{target}: is {what} ({guard}), which is read-only",
                "inside": f"{target}: is inside {what} ({guard}), which is read-only",
                "contains": f"{target}: holds {what} ({guard}); replacing it would delete that"}[how]
    return None


def vindex_reads(path: str | Path, index: dict, what: str) -> list[tuple[Path, str]]:
    """A vindex a writer reads, and the model it was extracted from (its index.json's `source.path`,
    which `larql verify --repair` and GGUF output read again)."""
    out = [(Path(path), what)]
    src = index.get("source", {}).get("path") if isinstance(index.get("source"), dict) else None
    if isinstance(src, str) and src:
        out.append((Path(src), f"the model {path} was extracted from"))
    return out
