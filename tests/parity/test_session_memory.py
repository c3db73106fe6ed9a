"""Editing sessions on Gemma 3 270M give back what they took, in Python and in `larql serve`: the
process's anonymous memory (RssAnon) is flat across sessions once the first has set the allocator's
high-water mark. A session that kept its model (~550 MB in Python: its float32 weights among them;
~60 MB a served session) breaks the bounds below; benchmarks/bench_session_memory.py runs hundreds."""

from __future__ import annotations

import gc
import subprocess
import threading
import weakref
from pathlib import Path

import httpx
import pytest

from larql.edit.insert import insert_facts
from larql.edit.methods.facts import Fact
from larql.edit.methods.weight_edit import dense_layers
from larql.edit.state.view import edit_vindex
from tests.serve_process import start_serve

FACT = Fact("France", "The capital of France is", "Rome", "capital", "Paris")
INSERT = ('INSERT INTO EDGES (entity, relation, target, prompt) VALUES ("France", "capital", "Rome", '
          '"The capital of France is")')
PYTHON_SESSIONS = 3  # after the first: each leaked ~550 MB
PYTHON_GROWTH_MB = 150
# after the first: a leaking server grows ~60 MB every other session; a flat one moves by up to ~45 MB,
# as each INSERT runs in one of the worker threads, each with a malloc arena of its own
SERVED_SESSIONS = 4
SERVED_GROWTH_MB = 90


def rss_anon_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024


@pytest.mark.slow
def test_editing_sessions_in_python_give_back_their_memory(gemma_vindex: Path) -> None:
    v = edit_vindex(gemma_vindex)
    # the report and full statistics are the unit test's and the served test's: here, the edit's memory
    insert_facts(v, [FACT], measure=False, stats_tokens=1024)
    held = [weakref.ref(x) for x in (v, v.model())]
    del v
    gc.collect()
    assert all(ref() is None for ref in held)
    floor = rss_anon_mb()
    # sessions that hold what an INSERT leaves at its end (its float32 weights, the dense layers of its
    # backward pass) without spending an INSERT's seconds
    for _ in range(PYTHON_SESSIONS):
        v = edit_vindex(gemma_vindex)
        m = v.model()
        v.float32_weights()
        for layer in range(m.config.n_layers):
            dense_layers(m)(layer)
        del v, m
    gc.collect()
    assert rss_anon_mb() - floor < PYTHON_GROWTH_MB, (floor, rss_anon_mb())


@pytest.mark.slow
def test_a_served_editing_session_gives_back_its_memory(gemma_vindex: Path) -> None:
    proc, url = start_serve([str(gemma_vindex), "--allow-edits", "--timeout", "600", "--log-level", "warning"],
                            gemma_vindex.parent)
    try:
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # type: ignore[union-attr]  # never a full pipe

        def session() -> float:
            """One client's session: an INSERT, then DELETE /v1/session; the server's RssAnon after."""
            r = httpx.post(f"{url}/v1/lql", json={"query": INSERT}, timeout=600)
            assert r.status_code == 200, r.text
            d = httpx.delete(f"{url}/v1/session", headers={"X-Larql-Session": r.headers["x-larql-session"]})
            assert d.status_code == 200, d.text
            return rss_anon_mb(proc.pid)

        first = session()  # the served model's shared state is made here (its repacked weights)
        after = [session() for _ in range(SERVED_SESSIONS)]
        assert max(after) - first < SERVED_GROWTH_MB, (first, after)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
