"""Faults of Ray shards on a real local cluster: replicas share the calls, an actor killed in the middle
of a generation is restarted by Ray (or its replica answers) and the generated tokens are those of
the uninterrupted run; one killed for good is an error naming the shard, and a slow one is reported
at the timeout rather than waited on."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import larql
from larql.errors import RemoteError
from larql.grid.client import RayGrid
from tests.cli.conftest import larql as run_larql
from tests.grid.conftest import SMALL

pytestmark = pytest.mark.usefixtures("cluster")
ray = pytest.importorskip("ray")


def pid(actor: Any) -> int:
    return int(ray.get(actor.info.remote())["pid"])


def stream_killing(model: larql.Model, prompt: str, n: int, kills: dict[int, Any]) -> list[int]:
    """Greedy ids of `n` tokens, calling kills[k]() once k tokens have come."""
    ids = []
    for tok, _ in model.stream(model.tokenize(prompt), max_new_tokens=n):
        ids.append(tok)
        if len(ids) in kills:
            kills[len(ids)]()
    return ids


def test_replicas_share_the_calls_and_survive_their_deaths(fresh_budget: None) -> None:
    local = larql.load("gemma3-270m")
    grid = RayGrid.start(str(local.source), local, "4-11", options=replace(SMALL, replicas=2))
    try:
        remote = grid.attach(local)
        prompt = "The capital of France is"
        want = local.generate(prompt, max_new_tokens=10).ids
        assert remote.generate(prompt, max_new_tokens=10).ids == want
        (_, (a, b)), = grid.calls()
        assert a > 0 and b > 0 and abs(a - b) <= 1  # 8 layers x 10 passes (+ the info call), in turn
        first, second = grid.groups[0].actors
        got = stream_killing(remote, prompt, 10, {
            3: lambda: os.kill(pid(first), signal.SIGKILL),  # Ray restarts it; meanwhile its replica answers
            6: lambda: ray.kill(second, no_restart=True)})  # gone for good: the restarted one takes every call
        assert got == want
        assert grid.groups[0].actors[1] is None  # left the rotation
    finally:
        grid.close()


def test_a_lone_actor_is_restarted_and_one_killed_for_good_is_named(tiny_vx: Path) -> None:
    model = larql.load(tiny_vx)
    grid = RayGrid.start(str(tiny_vx), model, "1-2", options=SMALL)
    try:
        remote = grid.attach(model)
        want = model.generate("hello there", max_new_tokens=8).ids
        actor = grid.groups[0].actors[0]
        before = pid(actor)
        assert stream_killing(remote, "hello there", 8, {2: lambda: os.kill(before, signal.SIGKILL)}) == want
        assert pid(actor) != before  # a new process answered the rest
        ray.kill(actor, no_restart=True)
        with pytest.raises(RemoteError, match=r"^the Ray shard of layers 1-2 is gone: every replica died \("):
            remote.generate("hello there", max_new_tokens=2)
        assert model.generate("hello there", max_new_tokens=8).ids == want  # the client's own model still runs
    finally:
        grid.close()


def test_a_slow_shard_is_reported_at_the_timeout(tiny_vx: Path) -> None:
    model = larql.load(tiny_vx)
    grid = RayGrid.start(str(tiny_vx), model, "1-1", options=replace(SMALL, latency=3.0, timeout=0.5))
    try:
        t0 = time.monotonic()
        with pytest.raises(RemoteError, match="shard of layers 1-1 did not answer layer 1 within 0.5 s"):
            grid.attach(model).forward(model.tokenize("hello"))
        assert time.monotonic() - t0 < 2.5
    finally:
        grid.close()


def test_command_line_reports_a_shard_fault_in_one_line(tiny_vx: Path) -> None:
    r = run_larql("run", str(tiny_vx), "hello", "--max-tokens", "2", "--ray", "local", "--ray-shards", "1-2",
                  "--ray-timeout", "0.000001")
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("larql: error: the Ray shard of layers 1-2 did not answer") and "Traceback" not in r.stderr
