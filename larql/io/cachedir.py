"""Where larql keeps what it can rebuild (the LQL parser tables, tokenizers, verified hashes, edit
statistics): $LARQL_CACHE, else $XDG_CACHE_HOME/larql, else ~/.cache/larql.

A leaf: it imports nothing from larql, so the parser, the CLI and the model may all use it. Every
user of the directory must carry on (slower, never wrong) when it cannot be written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The cache directory (not created here).

    Example:
        >>> cache_dir({"LARQL_CACHE": "/tmp/lc"})
        PosixPath('/tmp/lc')
    """
    if env.get("LARQL_CACHE"):
        return Path(env["LARQL_CACHE"])
    xdg = env.get("XDG_CACHE_HOME", "")  # the XDG spec: unset, empty or relative means the default
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path(env.get("HOME") or Path.home()) / ".cache"
    return base / "larql"
