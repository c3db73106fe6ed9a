"""`larql serve` as a command: it prints where it listens, answers, and on SIGTERM lets the request
in flight finish before it exits 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx


def test_serve_command_and_graceful_shutdown(infer_vx: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "larql", "serve", str(infer_vx), "--port", "0"],
                            stderr=subprocess.PIPE, text=True, env=env, cwd=infer_vx.parent)
    try:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        m = re.search(r"at (http://127\.0\.0\.1:\d+) \(read-only\)", line)
        assert m, line
        url = m.group(1)
        deadline = time.monotonic() + 60
        while True:  # the URL is printed once the socket is bound; uvicorn accepts a moment later
            try:
                assert httpx.get(f"{url}/v1/health").json()["status"] == "ok"
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        slow = "; ".join(f'TRACE "hello there {i}" FOR "x"' for i in range(32))
        answer: dict[str, Any] = {}

        def client() -> None:
            r = httpx.post(f"{url}/v1/lql", json={"query": slow}, timeout=120)
            answer.update(status=r.status_code, n=len(r.json()["results"]))

        t = threading.Thread(target=client)
        t.start()
        time.sleep(0.5)  # the request is being served
        proc.send_signal(signal.SIGTERM)
        t.join(timeout=120)
        assert answer == {"status": 200, "n": 32}
        assert proc.wait(timeout=60) == 0
        log = proc.stderr.read()  # type: ignore[union-attr]
        assert "Shutting down" in log and log.rstrip().endswith("larql: server stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
