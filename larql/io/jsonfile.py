"""Reading JSON that larql did not necessarily write (index.json, weights.json, patches, edit sets):
the size is bounded before anything is read, the nesting before anything is parsed, and NaN or
Infinity are refused, so a hostile file ends in one LarqlError, never a RecursionError or a
gigabyte allocation."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np

from larql.errors import LarqlError, VindexError

# a JSON string, escapes included, unrolled so long base64 strings match without backtracking. The
# closing quote is optional: an unterminated string then runs to the end of the text in one match,
# where requiring it would rescan from every later quote (quadratic: 15 s for 40 KB of `"\`).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*\\?"?', re.DOTALL)


def json_depth(text: str) -> int:
    """The deepest bracket nesting of a JSON text, brackets inside strings not counted; computed
    without recursion (strings cut out by a regex, the rest summed by numpy)."""
    bare = np.frombuffer(_STRING.sub("", text).encode("utf-8", "replace"), np.uint8)
    step = (bare == ord("[")).astype(np.int64) + (bare == ord("{")) - (bare == ord("]")) - (bare == ord("}"))
    return int(np.cumsum(step).max(initial=0))


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, where: str, max_depth: int, what: str, error: type[LarqlError] = VindexError) -> Any:
    """Parse JSON text with nesting bounded and NaN/Infinity refused."""
    depth = json_depth(text)
    if depth > max_depth:
        raise error(f"{where}: nested {depth} deep, more than a {what} can be ({max_depth})")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as e:
        raise error(f"{where}: not valid JSON, so not a {what} file ({e})") from e


def read_bounded(path: Path, max_bytes: int, what: str, error: type[LarqlError] = VindexError) -> bytes:
    """The bytes of a regular file of at most `max_bytes`. The size is checked before the file is
    opened, so /dev/zero, a FIFO or a 100 GB file is refused at once instead of read."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file") from None
    except OSError as e:
        raise error(f"{path}: cannot read the {what} ({e.strerror or e})") from e
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: not a regular file, so not a {what}")
    if st.st_size > max_bytes:
        raise error(f"{path}: {st.st_size:,} bytes, more than a {what} can be ({max_bytes:,})")
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)  # bounded again: the file may have grown since the stat
    except OSError as e:
        raise error(f"{path}: cannot read the {what} ({e.strerror or e})") from e
    if len(data) > max_bytes:
        raise error(f"{path}: more than a {what} can be ({max_bytes:,} bytes)")
    return data


def read_json(path: Path, max_bytes: int, max_depth: int, what: str, error: type[LarqlError] = VindexError) -> Any:
    """Read and parse a JSON file, bounded in size as `read_bounded` and in nesting as `parse_json`."""
    data = read_bounded(path, max_bytes, what, error)
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text, so not a {what} ({e.reason} at byte {e.start})") from e
    return parse_json(text, str(path), max_depth, what, error)
