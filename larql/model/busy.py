"""Decode steps on one thread while other processes hold this machine's cores.

A decode step is ~130-210 small parallel regions (one per matvec, numba's workers spinning ~0.1 ms
before they sleep: threads.py). With the other core taken by another process, each
region waits until its worker is scheduled, and two threads were slower than one for every
Gemma 3 / SmolLM2 matrix (docs/design/cpu-paths.md). So a pass
over a few rows, and its lm_head, check the kernel's count of runnable tasks (threads.machine_busy,
one read of /proc/loadavg) and run on one thread while others run, unless the thread count was
asked for (--threads, $LARQL_THREADS). Prefill (BLAS) is unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numba

from larql import threads

_CORES = threads.available_cores()
FEW_ROWS = 16  # passes over at most this many rows (decode steps, small batches) adapt
# /proc/loadavg is read at most this often: a decode step asks twice (its layers, its lm_head), and
# reading it every time would cost ~1.5% of a Gemma 3 token
RECHECK_S = 0.05
_seen = [-1.0, False]  # (when, busy): a race between threads only rereads the file


def _busy() -> bool:
    now = time.monotonic()
    if now - _seen[0] >= RECHECK_S:
        _seen[1], _seen[0] = threads.machine_busy(_CORES), now
    return bool(_seen[1])


@contextmanager
def step_threads(rows: int) -> Iterator[None]:
    """Run the body on one numba thread if it is a pass over few rows and the machine is busy (as
    last read, at most RECHECK_S ago)."""
    n = numba.get_num_threads()
    if rows > FEW_ROWS or n == 1 or threads.explicit() or not _busy():
        yield
        return
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(n)
