"""The temporary names larql writes under, and the clean-up of ones a killed writer left behind.

Every output (a vindex, a model directory, a GGUF, a patch, a trace) is written to a hidden sibling
`.NAME.tmp-PID` and renamed into place when complete; an overwrite first moves the old output to
`.NAME.old-PID`. A writer killed with SIGKILL (or a power cut) leaves those behind and nothing at
NAME that looks complete. The next writer of NAME removes the temporaries whose process is gone
(`clean_stale`) and, if NAME itself is missing, puts a `.old-PID` back: it was a complete output.

Two writes every output uses: `swap_dir` puts a complete directory in place (the old one moved
aside first), and `write_cache` writes a file larql can rebuild (tokenizer merges, parser tables,
edit statistics, verified hashes) atomically and best effort.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TEMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")


def temp_path(target: Path, kind: str = "tmp") -> Path:
    """`.NAME.tmp-PID` (or `.old-PID`) beside `target`, owned by this process."""
    return target.with_name(f".{target.name}.{kind}-{os.getpid()}")


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (ours, or another user's: then it is alive too)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            p.unlink()
        except OSError:
            pass


def clean_stale(target: str | Path) -> list[Path]:
    """Remove the `.NAME.tmp-PID` / `.NAME.old-PID` entries beside `target` whose process is dead
    (a `.old-PID` goes back to NAME when NAME is missing). Returns what was removed or restored.
    Never raises: a directory that cannot be listed has nothing we could clean."""
    target = Path(target)
    done: list[Path] = []
    try:
        entries = list(target.parent.iterdir()) if target.parent.is_dir() else []
    except OSError:
        return done
    stale = []
    for p in entries:
        m = TEMP_RE.match(p.name)
        if m and m["name"] == target.name and int(m["pid"]) != os.getpid() and not pid_alive(int(m["pid"])):
            stale.append((m["kind"], p))
    for kind, p in sorted(stale, key=lambda kp: kp[0] == "tmp"):  # .old first: it may be restored
        if kind == "old" and not os.path.lexists(target):
            try:
                os.rename(p, target)
                done.append(p)
                continue
            except OSError:
                pass
        _remove(p)
        done.append(p)
    return done


def publish(tmp: Path, target: Path, overwrite: bool) -> None:
    """Rename the complete file `tmp` to `target`. Without `overwrite` an existing `target` is never
    replaced, even one that appears meanwhile (a hard link fails on it; where links are not allowed,
    checked just before the rename). Raises FileExistsError then, with `tmp` left for the caller."""
    if overwrite:
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise
    except OSError:  # no hard links here (some file systems): check, then rename
        if os.path.lexists(target):
            raise FileExistsError(17, "File exists", str(target)) from None
        os.rename(tmp, target)
        return
    os.unlink(tmp)


def swap_dir(tmp: Path, target: Path) -> None:
    """Rename the complete directory `tmp` to `target`. An existing `target` is first moved to
    `.NAME.old-PID` and removed only after the rename, so a crash in between loses nothing
    (`clean_stale` puts it back)."""
    if target.exists():
        old = temp_path(target, "old")
        os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, target)


def write_cache(target: Path, write: Callable[[BinaryIO], object], *, private: bool = False,
                dir_mode: int = 0o777) -> bool:
    """Write a file larql can rebuild: `write(f)` fills `.NAME.tmp-PID` beside `target` (stale ones
    of killed writers removed first), which is then renamed over `target`, so a reader never sees
    half a file. Best effort: an OSError (a read-only or full disk) leaves nothing behind and
    returns False; the caller computes again next time.

    Args:
        target: the cache file; its directory is made (with `dir_mode`) if missing.
        write: writes the contents to the binary file it is given.
        private: create the file readable by its owner only (0600).
    """
    tmp = temp_path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=dir_mode)
        clean_stale(target)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, target)
        return True
    except OSError:
        _remove(tmp)
        return False
    except BaseException:
        _remove(tmp)
        raise
