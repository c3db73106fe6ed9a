"""Server-side batching: next-token passes of few rows that arrive together run as one forward pass.

Every generation step (a completion's prefill, then each decode step) and every INFER of the shared
served model asks the batcher for "the logits after these ids, appended to this cache". Short passes
(fewer than `solo_rows` tokens: every decode step) are gathered for a short window (`window_s`, a
few ms; at once when full: `max_batch` passes or `max_rows` rows) and run as one
`Model.next_logits_batch` in the batcher's thread (sequences packed end to end, each attending only
to itself: the answers equal one-by-one within float rounding); each caller gets its own row, after
its `after` (sampling, decoding) ran on it in that thread. While one batch runs the next gathers: a
continuous batch, sequences joining and leaving at any step.

Why only short passes: the quantized matmuls' cost is widening each weight to float32, and a
small-batch kernel widens a weight once for four rows, of one sequence or of several; a prompt of
several tokens already fills those four rows alone, so packing prompts together saves nothing and
would only queue them behind one another (and past 16 rows the matmuls take the dequantize + BLAS
path, slower on a decode-sized batch). Long passes run at once, in parallel, as before. Clients with
a session run their own overlay and stay on the one-by-one path.
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
    future: asyncio.Future[Any] | None = field(repr=False)  # None: run at once, not batched


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

    def __init__(self, window_s: float = 0.003, max_batch: int = 16, max_rows: int = 16, solo_rows: int = 4,
                 max_waiting: int = 256, solo_pool: ThreadPoolExecutor | None = None, runners: int = 1) -> None:
        self.window_s, self.max_batch, self.max_rows, self.solo_rows = window_s, max_batch, max_rows, solo_rows
        self.max_waiting, self.solo_pool = max_waiting, solo_pool
        self.rows = 0  # rows waiting
        self.runners = runners  # batches that may run at once
        self.pool = ThreadPoolExecutor(max_workers=runners, thread_name_prefix="larql-batch")
        self.waiting: list[Job] = []
        self.running = 0
        self.timer: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stats = BatchStats()

    async def next_logits(self, model: Model, ids: list[int], cache: KVCache | None = None,
                          after: After | None = None) -> Any:
        """`after(logits)` (the logits `[vocab]` themselves if None), the pass run with others'."""
        self.loop = loop = asyncio.get_running_loop()
        if len(ids) >= self.solo_rows:  # a prompt: its own pass, at once (see the module doc)
            return solo(await loop.run_in_executor(self.solo_pool, _alone, Job(model, ids, cache, after, None)))
        if len(self.waiting) >= self.max_waiting:
            raise LimitError(f"the server is busy ({len(self.waiting)} passes waiting); try again", status=503)
        future = loop.create_future()
        self.waiting.append(Job(model, ids, cache, after, future))
        self.rows += len(ids)
        self._kick()
        return await future

    def next_logits_from_thread(self, model: Model, ids: list[int], timeout: float | None = None) -> Any:
        """`next_logits` for a worker thread (an LQL INFER): blocks that thread, not the event loop."""
        if len(ids) >= self.solo_rows:  # a prompt: in this thread, at once
            return solo(_alone(Job(model, ids, None, None, None)))
        assert self.loop is not None, "the batcher has not run on the server's event loop yet"
        fut = asyncio.run_coroutine_threadsafe(self.next_logits(model, ids), self.loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()  # its pass, if not begun, is dropped
            raise

    def _kick(self) -> None:
        """Start a batch when one can start: at once if full, else when the window closes."""
        if self.running >= self.runners or not self.waiting:
            return
        if len(self.waiting) >= self.max_batch or self.rows >= self.max_rows:
            self._start()
        elif self.timer is None:
            assert self.loop is not None
            self.timer = self.loop.call_later(self.window_s, self._start)

    def _start(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        taken, rows = 0, 0
        while taken < min(len(self.waiting), self.max_batch) and (
                taken == 0 or rows + len(self.waiting[taken].ids) <= self.max_rows):
            rows += len(self.waiting[taken].ids)
            taken += 1
        jobs = [j for j in self.waiting[:taken] if j.future is not None and not j.future.done()]  # done: gave up
        del self.waiting[:taken]
        self.rows -= rows
        if not jobs:
            self._kick()
            return
        self.running += 1
        assert self.loop is not None
        self.loop.run_in_executor(self.pool, run_jobs, jobs).add_done_callback(
            lambda fut: self._finish(jobs, fut))

    def _finish(self, jobs: list[Job], fut: asyncio.Future[list[tuple[bool, Any]]]) -> None:
        self.running -= 1
        exc = fut.exception()
        outcomes = [(False, exc)] * len(jobs) if exc is not None else fut.result()
        self.stats.batches += 1
        self.stats.jobs += len(jobs)
        self.stats.largest = max(self.stats.largest, len(jobs))
        for job, (ok, value) in zip(jobs, outcomes):
            if job.future is not None and not job.future.done():
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


def solo(outcome: tuple[bool, Any]) -> Any:
    ok, value = outcome
    if not ok:
        raise value
    return value


def _alone(job: Job) -> tuple[bool, Any]:
    """A pass not batched: `next_logits`, as the server ran every pass before it batched."""
    try:
        return _after(job, job.model.next_logits(job.ids, job.cache))
    except Exception as e:
        return False, e


def _one(job: Job) -> tuple[bool, Any]:
    try:
        return _after(job, _pass([job])[0])
    except Exception as e:
        return False, e
