"""A vindex is checked before it answers: index.json against the digest sealed into it, every other
file against the sha256 index.json records for it.

Hashing is sha256 (hashlib; about 500 MB/s with SHA-NI here, so a 640 MB vindex takes about 1.3 s the
first time). A file whose hash matched is remembered in a per-user cache keyed on the file's
(device, inode, size, mtime_ns, ctime_ns): any write to the file, a copy or a replacement changes
the key, and ctime cannot be set back from user space, so a cache hit means the bytes hashed are
the bytes there. The cache lives under $LARQL_CACHE (not in the vindex, which stays read-only); if it
cannot be written every open hashes again, which is slower but never wrong.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from larql.errors import VindexError
from larql.io.tempfiles import write_cache
from larql.model.tokenizer import cache_dir
from larql.vindex import layout

SEAL_KEY = "index_sha256"  # index.json's digest of its own canonical form, without this key
_CACHE_VERSION = 1
_log = logging.getLogger("larql.vindex")
_warned: set[Path] = set()  # unsealed vindexes already warned about in this process


def canonical_digest(index: dict[str, Any]) -> str:
    """sha256 of index.json's content in a canonical form (sorted keys, no whitespace), so a
    reformatted index.json keeps its seal and a changed value breaks it."""
    body = {k: v for k, v in index.items() if k != SEAL_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def seal(index: dict[str, Any]) -> dict[str, Any]:
    """index.json as written: the fields plus the digest a later open checks them against."""
    return {**{k: v for k, v in index.items() if k != SEAL_KEY}, SEAL_KEY: canonical_digest(index)}


def repair_hint(index: dict[str, Any], path: Path) -> str:
    """How to get an intact copy of this vindex back: re-extract it, or compile it again."""
    compiled = index.get("compiled_from")
    if isinstance(compiled, dict) and compiled.get("path"):
        return f"compile it again from {compiled['path']} (COMPILE ... INTO VINDEX)"
    source = index.get("source", {}).get("path", "<model>") if isinstance(index.get("source"), dict) else "<model>"
    level = index.get("extract_level", "browse")
    if (Path(source) / layout.INDEX_FILE).is_file():  # a vindex is the source only of a converted LARQL vindex
        return f"convert it again: larql convert {source} {path} --level browse --force"
    return f"re-extract it: larql extract {source} -o {path} --level {level} --force"


def check_seal(index: dict[str, Any], path: Path) -> None:
    """Raise if index.json's fields differ from the ones sealed at extraction; warn (once per process)
    for a vindex written before seals existed, whose other files are still hash-checked."""
    recorded = index.get(SEAL_KEY)
    where = path / layout.INDEX_FILE
    if recorded is None:
        if where.resolve() in _warned:
            return
        _warned.add(where.resolve())
        _log.warning("%s: no %s seal (written by an older larql), so its own fields are not verified; "
                     "%s", where, SEAL_KEY, repair_hint(index, path))
        return
    if recorded != canonical_digest(index):
        raise VindexError(f"{where}: its fields were changed after it was written (the {SEAL_KEY} seal does not "
                          f"match); {repair_hint(index, path)}")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def sha256_path(path: Path) -> tuple[str, int]:
    """The sha256 and byte size of a file, or of a directory's files in path order (an HF model
    directory): the source a vindex records it was extracted from."""
    h, size = hashlib.sha256(), 0
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        with open(f, "rb") as fh:
            while block := fh.read(1 << 22):
                h.update(block)
                size += len(block)
    return h.hexdigest(), size


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class CheckedFiles:
    """The per-user record of which files of one vindex were hashed, and what they hashed to."""

    def __init__(self, vindex: Path) -> None:
        key = hashlib.sha256(str(vindex.resolve()).encode()).hexdigest()[:32]
        self.path = cache_dir() / "verified" / f"{key}.json"
        self.entries: dict[str, list[Any]] = {}
        self._dirty = False
        try:
            doc = json.loads(self.path.read_text())
            if isinstance(doc, dict) and doc.get("version") == _CACHE_VERSION and isinstance(doc.get("files"), dict):
                self.entries = doc["files"]
        except (OSError, ValueError):
            pass  # no cache yet, or an unreadable one: everything is hashed again

    def known(self, name: str, st: os.stat_result, sha256: str) -> bool:
        """Was this very file (same stat key) hashed before, to `sha256`?"""
        entry = self.entries.get(name)
        return entry == [*_stat_key(st), sha256]

    def remember(self, name: str, st: os.stat_result, sha256: str) -> None:
        self.entries[name] = [*_stat_key(st), sha256]
        self._dirty = True

    def save(self) -> None:
        """Write atomically (temp + rename); a cache that cannot be written is not an error."""
        if not self._dirty:
            return
        doc = json.dumps({"version": _CACHE_VERSION, "files": self.entries}).encode()
        if write_cache(self.path, lambda f: f.write(doc), private=True, dir_mode=0o700):
            self._dirty = False


def check_contents(path: Path, index: dict[str, Any], names: list[str] | None = None,
                   use_cache: bool = True) -> list[str]:
    """Hash the files index.json lists (or `names` of them) against their recorded sha256.

    Returns the names that differ. Files remembered in the cache with an unchanged stat are not
    read again unless `use_cache` is False (`larql verify` reads everything).
    """
    cache = CheckedFiles(path)
    bad = []
    for name in names if names is not None else sorted(index["files"]):
        expected = index["files"][name]["sha256"]
        f = path / name
        st = f.stat()
        if use_cache and cache.known(name, st, expected):
            continue
        if file_sha256(f) == expected:
            cache.remember(name, st, expected)
        else:
            bad.append(name)
    cache.save()
    return bad


def remember_written(path: Path, files: dict[str, dict[str, Any]]) -> None:
    """A writer hashed these files as it wrote them: record them so the first open is cheap."""
    cache = CheckedFiles(path)
    for name, entry in files.items():
        cache.remember(name, (path / name).stat(), entry["sha256"])
    cache.save()


def require_intact(path: Path, index: dict[str, Any]) -> None:
    """Raise one VindexError naming the first damaged file and the fix."""
    bad = check_contents(path, index)
    if bad:
        raise VindexError(f"{path / bad[0]}: contents differ from the sha256 in index.json (damaged or changed "
                          f"after it was written{f'; also {len(bad) - 1} more file(s)' if len(bad) > 1 else ''}); "
                          f"{repair_hint(index, path)}")
