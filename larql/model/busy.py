"""Decode steps on one thread while other processes hold this machine's cores.

A decode step is ~130-210 small parallel regions (one per matvec, numba's workers spinning ~0.1 ms
before they sleep: threads.py). With the other core taken by another process, each
region waits until its worker is scheduled, and two threads were slower than one for every
Gemma 3 / SmolLM2 matrix (2 cores, another job running two threads: 256 x 640 23 against 14 us,
2048 x 640 108 against 94 us; Gemma's lm_head candidate pass 12-15 against 8.5-9.4 ms). So a pass
over a few rows, and its lm_head, check the kernel's count of runnable tasks (threads.machine_busy,
one read of /proc/loadavg) and run on one thread while others run, unless the thread count was
asked for (--threads, $LARQL_THREADS). Prefill (BLAS) is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numba

from larql import threads

_CORES = threads.available_cores()
FEW_ROWS = 16  # passes over at most this many rows (decode steps, small batches) adapt


@contextmanager
def step_threads(rows: int) -> Iterator[None]:
    """Run the body on one numba thread if it is a pass over few rows and the machine is busy."""
    n = numba.get_num_threads()
    if rows > FEW_ROWS or n == 1 or threads.explicit() or not threads.machine_busy(_CORES):
        yield
        return
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(n)
