"""Worker-thread settings for numba, OpenMP and BLAS, applied before any of them starts.

A leaf: it imports nothing from larql, so the CLI can call it before numpy or numba load. The
thread pools read their environment once, when the library first starts a thread, so a count set
after that point is too late for BLAS (OpenBLAS sizes its pool when numpy is imported).

Why a short spin: numba's OpenMP layer (GNU libgomp) lets a worker that has finished spin
before it sleeps. libgomp's default spin (milliseconds) steals the cores a busy machine's other
work needs and slows decoding itself; no spin at all (OMP_WAIT_POLICY=PASSIVE) makes every parallel
region wake a sleeping worker, and a decode step runs ~200 regions. GOMP_SPINCOUNT=3000 keeps a
worker awake across the few microseconds between one matvec and the next and asleep ~0.1 ms after
the last (docs/design/cpu-paths.md has the measurements). It is libgomp's setting, so a library in
the same process that uses OpenMP (llama.cpp's ggml) gets it too.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import MutableMapping

ENV_VAR = "LARQL_THREADS"
SPIN_COUNT = 3000  # libgomp's spins before an idle worker sleeps (~0.1 ms here; see above)
# the variables each library reads for its pool size
_COUNT_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
# BLAS serves prefill GEMMs and DESCRIBE's probes. Its pool (OpenBLAS's, in numpy's wheels)
# busy-waits and has no wait-policy setting: on a busy machine one thread is faster, on a quiet one
# every core is (bench_load.py). So BLAS gets one thread only when other processes are already
# running on our cores at start-up.
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


# what configure() changed in os.environ: each variable's value before (None: unset)
_user_values: dict[str, str | None] = {}


def user_environ() -> dict[str, str]:
    """This process's environment as it was before configure() changed it: for a peer engine run
    in a child process (larql bench's llama.cpp), so that larql's thread settings do not become its."""
    env = dict(os.environ)
    for k, v in _user_values.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


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
    before = dict(env)
    explicit = requested(n)
    _explicit[0] = _explicit[0] or n is not None
    cores = available_cores()
    count = max(1, explicit if explicit is not None else cores)
    # the machine is sampled only when a BLAS count is still to be set (`import larql` sets it; the CLI's
    # own call after that, without --threads, changes nothing and need not wait for the samples)
    unset = any(var not in env for var in _BLAS_VARS)
    blas = count if explicit is not None or not unset or not machine_stays_busy(cores) else 1
    if "OMP_WAIT_POLICY" not in env:  # a policy the user chose stays (GOMP_SPINCOUNT would override it)
        env.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))
    for var in _COUNT_VARS:
        value = str(blas if var in _BLAS_VARS else count)
        if explicit is not None:
            env[var] = value
        else:
            env.setdefault(var, value)
    if env is os.environ:
        _user_values.update({k: before.get(k) for k in (*_COUNT_VARS, "GOMP_SPINCOUNT")
                             if env.get(k) != before.get(k) and k not in _user_values})
    numba = sys.modules.get("numba")
    if numba is not None and explicit is not None:  # started already: resize what it allows
        numba.set_num_threads(min(count, numba.config.NUMBA_NUM_THREADS))
    return count
