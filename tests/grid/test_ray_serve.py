"""`larql serve` fronting Ray shards: the OpenAI-style completions and LQL run with the FFN of some
layers on actors, concurrent clients' decode steps reach a shard in one call (the server's batcher
packs them), and a client's edit session keeps its FFN on the shards, with its edits."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import larql
from larql.grid.client import RayGrid
from larql.serve.config import ServeConfig
from larql.serve.server import ServerThread
from larql.serve.sessions import open_served
from tests.cli.conftest import larql as run_larql
from tests.grid.conftest import SMALL

pytestmark = pytest.mark.usefixtures("cluster")
PROMPTS = ["hello there", "the cat sat on", "one two three", "a b c d"]


def complete(url: str, prompt: str, headers: dict[str, str] | None = None) -> str:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 6, "temperature": 0},
                   headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def test_a_server_with_its_ffn_on_ray_shards(tiny_vx: Path) -> None:
    local = larql.load(tiny_vx)
    grids: list[RayGrid] = []

    def wrap(model: Any) -> Any:
        grids.append(RayGrid.start(str(tiny_vx), model, "1-2", options=SMALL))
        return grids[0].attach(model)

    served = open_served(tiny_vx, wrap)
    try:
        with ServerThread(served, ServeConfig(batch=16, batch_window_ms=100, allow_edits=True)) as url:
            want = [local.generate(p, max_new_tokens=6).text for p in PROMPTS]
            assert complete(url, PROMPTS[0]) == want[0]
            before = sum(sum(c) for _, c in grids[0].calls())
            with ThreadPoolExecutor(len(PROMPTS)) as pool:
                got = list(pool.map(lambda p: complete(url, p), PROMPTS))
            assert got == want
            calls = sum(sum(c) for _, c in grids[0].calls()) - before
            assert calls < len(PROMPTS) * 6 * 2  # passes x remote layers one by one; batched steps share calls
            r = httpx.post(f"{url}/v1/lql", json={"query": 'INFER "hello there" TOP 3'}, timeout=120)
            assert r.status_code == 200, r.text
            # an edit session: its model is the served one with its overlay, the FFN still on the shards
            r = httpx.post(f"{url}/v1/lql", json={"query": "DELETE FROM EDGES WHERE layer = 1 AND feature = 5"},
                           timeout=120)
            assert r.status_code == 200, r.text
            session = {"X-Larql-Session": r.headers["X-Larql-Session"]}
            view = larql.edit_vindex(tiny_vx)
            view.overlay.delete(1, 5)
            before = sum(sum(c) for _, c in grids[0].calls())
            assert complete(url, PROMPTS[1], session) == view.model().generate(PROMPTS[1], max_new_tokens=6).text
            assert sum(sum(c) for _, c in grids[0].calls()) > before
    finally:
        for g in grids:
            g.close()


def test_serve_refuses_ray_with_ffn_only(tiny_vx: Path) -> None:
    r = run_larql("serve", str(tiny_vx), "--ffn-only", "--layers", "1-2", "--ray", "local", "--ray-shards", "1-2",
                  "--port", "0")
    assert r.returncode == 1 and "--ray goes without --ffn-only" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
