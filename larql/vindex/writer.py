"""Atomic vindex writing: everything goes to a hidden temporary directory next to the target, which
is renamed into place only after index.json (written last) is complete. An interrupted or failed
extraction leaves no directory that looks like a vindex."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import numpy as np

from larql.errors import VindexError
from larql.io.tempfiles import clean_stale, swap_dir, temp_path
from larql.vindex import integrity
from larql.vindex.layout import INDEX_FILE, align


class BinaryFile:
    """A file written sequentially, hashed as it goes, with aligned blocks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: BinaryIO = open(path, "wb")
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | memoryview | np.ndarray) -> int:
        """Append bytes; returns the offset they start at."""
        buf = np.ascontiguousarray(data).data.cast("B") if isinstance(data, np.ndarray) else memoryview(data)
        start = self.size
        self._f.write(buf)
        self._hash.update(buf)
        self.size += len(buf)
        return start

    def pad(self) -> int:
        """Zero-fill up to the next ALIGNMENT boundary; returns the new (aligned) offset."""
        gap = align(self.size) - self.size
        if gap:
            self.write(bytes(gap))
        return self.size

    def write_aligned(self, data: bytes | memoryview | np.ndarray) -> int:
        self.pad()
        return self.write(data)

    def close(self) -> dict[str, Any]:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        return {"size": self.size, "sha256": self._hash.hexdigest()}


class VindexWriter:
    """Context manager: `with VindexWriter(target) as w: ...; w.finish(index)`."""

    def __init__(self, target: Path, overwrite: bool = False) -> None:
        self.target = Path(target)
        self.overwrite = overwrite
        clean_stale(self.target)  # what a killed writer of this target left (a complete old one comes back)
        if self.target.exists() and not overwrite:
            raise VindexError(f"{self.target}: already exists; choose another path or pass --force")
        self.tmp = temp_path(self.target)
        self.files: dict[str, dict[str, Any]] = {}
        self._open: list[tuple[str, BinaryFile]] = []
        self._done = False

    def __enter__(self) -> VindexWriter:
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            if self.tmp.exists():
                shutil.rmtree(self.tmp)
            self.tmp.mkdir()
        except OSError as e:
            raise VindexError(f"{self.target}: cannot create the output directory ({e})") from e
        return self

    def binary(self, name: str) -> BinaryFile:
        f = BinaryFile(self.tmp / name)
        self._open.append((name, f))
        return f

    def text(self, name: str, content: str) -> None:
        data = content.encode()
        (self.tmp / name).write_bytes(data)
        self.files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def copy(self, name: str, source: Path) -> None:
        shutil.copyfile(source, self.tmp / name)
        data = (self.tmp / name).read_bytes()
        self.files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def link(self, name: str, source: Path, entry: dict[str, Any]) -> None:
        """Hard-link (else copy) `source` in, recording its known `{size, sha256}` unhashed: a
        damaged source keeps its old checksum, so `verify` catches it instead of blessing it."""
        try:
            os.link(source, self.tmp / name)
        except OSError:  # another file system, or links not allowed: a copy holds the same bytes
            shutil.copyfile(source, self.tmp / name)
        self.files[name] = {"size": entry["size"], "sha256": entry["sha256"]}

    def finish(self, index: dict[str, Any]) -> Path:
        """Close every file, write index.json (with the file table), then rename into place."""
        for name, f in self._open:
            self.files[name] = f.close()
        self._open.clear()
        index = integrity.seal({**index, "files": dict(sorted(self.files.items()))})
        (self.tmp / INDEX_FILE).write_text(json.dumps(index, indent=1, allow_nan=False))
        swap_dir(self.tmp, self.target)  # an old vindex is moved aside first, so a crash loses nothing
        self._done = True
        integrity.remember_written(self.target, self.files)  # hashed while written: the first open need not
        return self.target

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for _, f in self._open:
            try:
                f._f.close()
            except OSError:
                pass
        if not self._done:
            shutil.rmtree(self.tmp, ignore_errors=True)

