"""Server-side batching: next-token passes that arrive together run as one batched forward pass.

Every generation step (a completion's prefill, then each decode step) and every INFER of the shared
served model asks the batcher for "the logits after these ids, appended to this cache". The batcher
collects what arrives within a short window (`window_s`, a few ms; at once when `max_batch` are
waiting), runs them as one `Model.next_logits_batch` in its own thread (sequences packed end to end,
each attending only to itself: the answers equal one-by-one within float rounding), and hands each
caller its own row, after the caller's `after` (sampling, decoding) ran on it in that same thread.
While one batch runs, the next one gathers: a continuous batch, requests joining and leaving at any
step. Clients with a session run their own overlay and stay on the one-by-one path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import LimitError

if TYPE_CHECKING:
    from larql.model.attention import KVCache
    from larql.model.model import Model

After = Callable[[NDArray[np.float32]], Any]


@dataclass
class Job:
    """One caller's pass: `ids` run after what `cache` holds (a fresh cache if None)."""

    model: Model
    ids: list[int]
    cache: KVCache | None
    after: After | None
    future: asyncio.Future[Any] = field(repr=False)


@dataclass
class BatchStats:
    batches: int = 0  # batched passes run
    jobs: int = 0  # callers answered by them
    largest: int = 0  # the most callers in one pass

    def to_json(self) -> dict[str, Any]:
        return {"batches": self.batches, "jobs": self.jobs, "largest": self.largest,
                "mean": round(self.jobs / self.batches, 2) if self.batches else 0.0}


class Batcher:
    """Gathers next-token passes for `max_batch`-sized batched forward passes (see the module doc)."""

    def __init__(self, window_s: float = 0.003, max_batch: int = 16, max_waiting: int = 256) -> None:
        self.window_s, self.max_batch, self.max_waiting = window_s, max_batch, max_waiting
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="larql-batch")
        self.waiting: list[Job] = []
        self.running = False
        self.timer: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stats = BatchStats()

    async def next_logits(self, model: Model, ids: list[int], cache: KVCache | None = None,
                          after: After | None = None) -> Any:
        """`after(logits)` (the logits `[vocab]` themselves if None), the pass run with others'."""
        self.loop = loop = asyncio.get_running_loop()
        if len(self.waiting) >= self.max_waiting:
            raise LimitError(f"the server is busy ({len(self.waiting)} passes waiting); try again", status=503)
        job = Job(model, ids, cache, after, loop.create_future())
        self.waiting.append(job)
        self._kick()
        return await job.future

    def next_logits_from_thread(self, model: Model, ids: list[int], timeout: float | None = None) -> Any:
        """`next_logits` for a worker thread (an LQL INFER): blocks that thread, not the event loop."""
        assert self.loop is not None, "the batcher has not run on the server's event loop yet"
        fut = asyncio.run_coroutine_threadsafe(self.next_logits(model, ids), self.loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()  # its pass, if not begun, is dropped
            raise

    def _kick(self) -> None:
        """Start a batch when one can start: at once if full, else when the window closes."""
        if self.running or not self.waiting:
            return
        if len(self.waiting) >= self.max_batch:
            self._start()
        elif self.timer is None:
            assert self.loop is not None
            self.timer = self.loop.call_later(self.window_s, self._start)

    def _start(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        jobs = [j for j in self.waiting[:self.max_batch] if not j.future.done()]  # done: its caller gave up
        del self.waiting[:self.max_batch]
        if not jobs:
            self._kick()
            return
        self.running = True
        assert self.loop is not None
        self.loop.run_in_executor(self.pool, run_jobs, jobs).add_done_callback(
            lambda fut: self._finish(jobs, fut))

    def _finish(self, jobs: list[Job], fut: asyncio.Future[list[tuple[bool, Any]]]) -> None:
        self.running = False
        exc = fut.exception()
        outcomes = [(False, exc)] * len(jobs) if exc is not None else fut.result()
        self.stats.batches += 1
        self.stats.jobs += len(jobs)
        self.stats.largest = max(self.stats.largest, len(jobs))
        for job, (ok, value) in zip(jobs, outcomes):
            if not job.future.done():
                if ok:
                    job.future.set_result(value)
                else:
                    job.future.set_exception(value)
        self._kick()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.pool.shutdown(wait=False, cancel_futures=True)


def run_jobs(jobs: list[Job]) -> list[tuple[bool, Any]]:
    """Each job's (ok, result or exception): one batched pass per model among the jobs."""
    out: dict[int, tuple[bool, Any]] = {}
    groups: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(id(job.model), []).append(i)
    for members in groups.values():
        try:
            rows = _pass([jobs[i] for i in members])
        except Exception as e:
            for i in members:
                out[i] = (False, e) if len(members) == 1 else _one(jobs[i])
            continue
        for i, row in zip(members, rows):
            out[i] = _after(jobs[i], row)
    return [out[i] for i in range(len(jobs))]


def _pass(group: list[Job]) -> NDArray[np.float32]:
    model = group[0].model
    caches = [j.cache if j.cache is not None else model.new_cache(len(j.ids)) for j in group]
    return model.next_logits_batch([j.ids for j in group], caches)


def _after(job: Job, row: NDArray[np.float32]) -> tuple[bool, Any]:
    try:
        return True, row if job.after is None else job.after(row)
    except Exception as e:
        return False, e


def _one(job: Job) -> tuple[bool, Any]:
    try:
        return _after(job, _pass([job])[0])
    except Exception as e:
        return False, e
