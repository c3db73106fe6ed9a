"""Worker-thread settings for numba, OpenMP and BLAS, applied before any of them starts.

A leaf: it imports nothing from larql, so the CLI can call it before numpy or numba load. The
thread pools read their environment once, when the library first starts a thread, so a count set
after that point is too late for BLAS (OpenBLAS sizes its pool when numpy is imported).

Why a passive wait policy: numba's OpenMP layer (GNU libgomp) lets a worker that has finished
spin for a while before sleeping. On an idle machine that saves a wake-up; on a busy one (a
notebook, a browser, another job on the same cores) the spinning workers steal the cores the
working thread needs. Measured on this 2-core VM beside two busy processes
(benchmarks/bench_load.py): see the README's "Good manners under load".
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import MutableMapping

ENV_VAR = "LARQL_THREADS"
# the variables each library reads for its pool size
_COUNT_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
# BLAS serves prefill GEMMs and DESCRIBE's probes. Its pool (OpenBLAS's, in numpy's wheels)
# busy-waits and has no wait-policy setting: on a busy machine one BLAS thread made DESCRIBE 2.5x
# faster, but on a quiet one it cost prefill 30% (bench_load.py). So BLAS gets one thread only when
# other processes are already running on our cores at start-up.
_BLAS_VARS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def machine_busy(cores: int) -> bool:
    """Whether other processes are running right now: the kernel's count of runnable tasks
    (/proc/loadavg's fourth field, which counts this process too), not the load average, which
    lags by a minute. False where there is no /proc."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            runnable = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return False
    return runnable - 1 >= max(1, cores // 2)


def machine_stays_busy(cores: int, samples: int = 8, interval: float = 0.005) -> bool:
    """`machine_busy` at each of `samples` reads `interval` seconds apart (stopping at the first
    that is not): for a decision that lasts the whole process. One read can catch a moment — the
    other end of a pipe starting (`larql ... | grep`), the launching shell — and a 1,000-fact INSERT
    started that way ran BLAS on one thread for all of its 10 minutes (204 s against 123 s at 200
    facts); another job computing is still there 35 ms later. Costs one read when the machine is idle."""
    for i in range(samples):
        if not machine_busy(cores):
            return False
        if i + 1 < samples:
            time.sleep(interval)
    return True


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def requested(n: int | None = None) -> int | None:
    """The thread count asked for: `n` (from --threads), else $LARQL_THREADS, else None (the default)."""
    if n is not None:
        return n
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        # a leaf cannot import larql.errors' hierarchy lazily without a cycle risk; ValueError is
        # what the CLI turns into a usage error
        raise ValueError(f"{ENV_VAR}={raw!r} is not a positive whole number; unset it or set e.g. {ENV_VAR}=2")
    return int(raw)


# whether configure() was given a thread count (--threads): then decode steps keep it even on a busy
# machine (larql/model/busy.py), as they do with $LARQL_THREADS
_explicit = [False]


def explicit() -> bool:
    """Whether the thread count was asked for (--threads through configure, or $LARQL_THREADS)."""
    return _explicit[0] or bool(os.environ.get(ENV_VAR, "").strip())


def configure(n: int | None = None, env: MutableMapping[str, str] | None = None) -> int:
    """Set the thread-pool environment for `n` worker threads (None: $LARQL_THREADS or all cores;
    BLAS then gets one thread if the machine stays busy, see machine_stays_busy).

    Variables the user set already are left alone, except that an explicit `n` wins. Returns the
    numba thread count in effect. If numba is already imported its pool is resized too.
    """
    if env is None:
        env = os.environ
    explicit = requested(n)
    _explicit[0] = _explicit[0] or n is not None
    cores = available_cores()
    count = max(1, explicit if explicit is not None else cores)
    blas = count if explicit is not None or not machine_stays_busy(cores) else 1
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    for var in _COUNT_VARS:
        value = str(blas if var in _BLAS_VARS else count)
        if explicit is not None:
            env[var] = value
        else:
            env.setdefault(var, value)
    numba = sys.modules.get("numba")
    if numba is not None and explicit is not None:  # started already: resize what it allows
        numba.set_num_threads(min(count, numba.config.NUMBA_NUM_THREADS))
    return count
