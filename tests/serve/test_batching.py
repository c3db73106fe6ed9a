"""Server-side batching on a real loopback server: concurrent completions, chat completions and
INFERs run as batched passes (the server's /v1/info counts them) and answer what each gives alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import larql
from larql.errors import ModelError
from larql.serve.batcher import Job, run_jobs
from larql.serve.config import Limits
from tests.serve.conftest import Serve
from tests.serve.test_generation import sse

PROMPTS = ["hello", "hi there", "a b c d e", "x", "hello world, this is a longer prompt", "q", "the cat", "zz top"]


@pytest.fixture(scope="module")
def batched(serve: Serve, infer_vx: Path) -> Iterator[str]:
    # a wide window so that requests sent together surely meet in one batch, and prompts batched too
    with serve(infer_vx, limits=Limits(max_tokens=40), batch=8, batch_window_ms=60.0, batch_rows=512,
               solo_rows=512) as url:
        yield url


@pytest.fixture(scope="module")
def unbatched(serve: Serve, infer_vx: Path) -> Iterator[str]:
    with serve(infer_vx, limits=Limits(max_tokens=40), batch=0) as url:
        yield url


def together(fn: Callable[[int], Any], n: int) -> list[Any]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(fn, range(n)))


def stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/info").json()["batching"]


def completion(url: str, i: int, **kw: Any) -> dict[str, Any]:
    body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 4 + 3 * (i % 4), "temperature": 0, **kw}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return {k: r.json()[k] for k in ("choices", "usage")}


def test_concurrent_completions_are_batched_and_equal_one_by_one(batched: str, unbatched: str, infer_vx: Path) -> None:
    alone = [completion(unbatched, i) for i in range(8)]  # today's path: one request, one pass per token
    before = stats(batched)
    got = together(lambda i: completion(batched, i), 8)
    after = stats(batched)
    assert got == alone
    assert after["jobs"] - before["jobs"] > after["batches"] - before["batches"]  # some passes held several
    assert after["largest"] > 1
    model = larql.load(infer_vx)
    for i, g in enumerate(got):
        want = model.generate(PROMPTS[i % len(PROMPTS)], max_new_tokens=4 + 3 * (i % 4))
        assert g["choices"][0]["text"] == want.text


def test_sampled_and_chat_completions_batched(batched: str, unbatched: str) -> None:
    kw = {"temperature": 0.9, "top_k": 20, "seed": 7}
    alone = [completion(unbatched, i, **kw) for i in range(6)]
    assert together(lambda i: completion(batched, i, **kw), 6) == alone

    def chat(url: str, i: int) -> Any:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": PROMPTS[i]}], "max_tokens": 6, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()["choices"]

    assert together(lambda i: chat(batched, i), 5) == [chat(unbatched, i) for i in range(5)]


def test_streamed_completions_batched(batched: str, unbatched: str) -> None:
    def streamed(url: str, i: int) -> list[Any]:
        r = httpx.post(f"{url}/v1/completions", timeout=120, json={
            "prompt": PROMPTS[i], "max_tokens": 9, "temperature": 0, "stream": True})
        return [(e["choices"][0]["text"], e["choices"][0]["finish_reason"]) for e in sse(r)[:-1]]

    alone = [streamed(unbatched, i) for i in range(4)]
    assert together(lambda i: streamed(batched, i), 4) == alone and all(len(a) > 3 for a in alone)


def test_concurrent_infers_are_batched_and_equal_one_by_one(batched: str, unbatched: str) -> None:
    def infer(url: str, i: int) -> list[Any]:
        r = httpx.post(f"{url}/v1/lql", json={"query": f'INFER "{PROMPTS[i]}" TOP 4'}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["results"][0]["rows"]

    alone = [infer(unbatched, i) for i in range(8)]
    before = stats(batched)
    got = together(lambda i: infer(batched, i), 8)
    assert stats(batched)["jobs"] - before["jobs"] == 8
    for g, a in zip(got, alone):
        assert [row[:2] for row in g] == [row[:2] for row in a]  # rank, token
        np.testing.assert_allclose([row[2:] for row in g], [row[2:] for row in a], rtol=1e-4, atol=1e-6)


def test_by_default_prompts_run_alone_and_decode_steps_together(infer: str, unbatched: str, infer_vx: Path) -> None:
    """The default server: a prompt of 4 tokens or more is its own pass; the one-token decode steps
    of concurrent completions share passes, and every answer is still the one-by-one answer."""
    model = larql.load(infer_vx)
    long = [i for i, p in enumerate(PROMPTS) if len(model.tokenize(p)) >= 4]
    assert long  # some prompts run alone
    before = stats(infer)
    got = together(lambda i: completion(infer, i), 8)
    after = stats(infer)
    assert got == [completion(unbatched, i) for i in range(8)]
    steps = sum(g["usage"]["completion_tokens"] for g in got)  # a pass per token
    assert after["jobs"] - before["jobs"] == steps - len(long)  # the long prompts' prefills went alone
    assert after["batches"] - before["batches"] < after["jobs"] - before["jobs"]  # steps shared passes
    assert (after["max_rows"], after["solo_rows"]) == (16, 4)


def test_one_bad_pass_fails_alone(infer_vx: Path) -> None:
    model = larql.load(infer_vx)
    loop_future: Any = None  # run_jobs only reads the jobs' models, ids, caches and `after`
    good = [Job(model, model.tokenize(p), None, None, loop_future) for p in PROMPTS[:3]]
    bad = Job(model, [model.vocab_size + 5], None, None, loop_future)
    out = run_jobs([good[0], bad, *good[1:]])
    assert [ok for ok, _ in out] == [True, False, True, True]
    assert isinstance(out[1][1], ModelError) and "outside the vocabulary" in str(out[1][1])
    for (_, logits), job in zip([out[0], *out[2:]], good):
        np.testing.assert_allclose(logits, model.next_logits(job.ids), rtol=1e-4, atol=1e-5)
