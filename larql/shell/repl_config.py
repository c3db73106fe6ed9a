"""Where the REPL keeps its history and reads its settings: an environment variable, else the XDG
base directories (history is state, settings are config), else their documented defaults.

    history   $LARQL_HISTORY, else $XDG_STATE_HOME/larql/history   (~/.local/state/larql/history)
    settings  $LARQL_CONFIG,  else $XDG_CONFIG_HOME/larql/repl.toml (~/.config/larql/repl.toml)

The settings file holds the REPL's toggles, e.g. `json = false`, `timing = true`, `plan = false`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict, cast

from larql.errors import LarqlError

SETTINGS = ("json", "timing", "plan")


class Settings(TypedDict, total=False):
    """The REPL's toggles a settings file may set (ReplState's fields of the same names)."""

    json: bool
    timing: bool
    plan: bool


def _xdg(env: Mapping[str, str], var: str, default: str) -> Path:
    # the XDG spec: an unset, empty or relative value means the default
    value = env.get(var, "")
    base = Path(value) if value and os.path.isabs(value) else Path(env.get("HOME") or Path.home()) / default
    return base / "larql"


def history_path(env: Mapping[str, str] = os.environ) -> Path:
    """The REPL's history file (its directory is created when the REPL starts)."""
    if env.get("LARQL_HISTORY"):
        return Path(env["LARQL_HISTORY"])
    return _xdg(env, "XDG_STATE_HOME", ".local/state") / "history"


def settings_path(env: Mapping[str, str] = os.environ) -> Path:
    if env.get("LARQL_CONFIG"):
        return Path(env["LARQL_CONFIG"])
    return _xdg(env, "XDG_CONFIG_HOME", ".config") / "repl.toml"


def load_settings(path: Path) -> Settings:
    """The toggles a settings file sets ({} when there is no file); a bad file is a LarqlError."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise LarqlError(f"{path}: cannot read the REPL settings ({e}); fix or remove the file") from e
    bad = sorted(k for k, v in data.items() if k not in SETTINGS or not isinstance(v, bool))
    if bad:
        raise LarqlError(f"{path}: unknown or non-boolean setting {bad[0]!r}; settings are "
                         + ", ".join(f"{k} = true|false" for k in SETTINGS))
    return cast(Settings, dict(data))  # checked above: only SETTINGS, each a bool
