"""`larql serve` as a command: it prints where it listens, answers, and on SIGTERM lets the request
in flight finish before it exits 0."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.serve_process import start_serve


def test_serve_command_and_graceful_shutdown(infer_vx: Path) -> None:
    proc, url = start_serve([str(infer_vx)], infer_vx.parent, ready="(read-only)")
    try:
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
