"""`larql serve` as a real process for tests: started on a free loopback port, its URL read from the
line it prints, returned once it answers /v1/health."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def start_serve(args: list[str], cwd: Path, ready: str = "") -> tuple[subprocess.Popen[str], str]:
    """(the process, its URL) of `larql serve ARGS --port 0`; the printed line must also contain `ready`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "larql", "serve", *args, "--port", "0"],
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    line = proc.stderr.readline()  # type: ignore[union-attr]
    m = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
    if not m or ready not in line:
        proc.kill()
        raise AssertionError(line)
    url = m.group(1)
    deadline = time.monotonic() + 60
    while True:  # the URL is printed once the socket is bound; uvicorn accepts a moment later
        try:
            assert httpx.get(f"{url}/v1/health").json()["status"] == "ok"
            return proc, url
        except httpx.TransportError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.1)
