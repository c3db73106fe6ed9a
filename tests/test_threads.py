"""larql.threads: the thread-pool environment the CLI sets before numpy loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from larql.threads import available_cores, configure


def test_explicit_count_sets_every_pool_and_a_passive_wait() -> None:
    env: dict[str, str] = {"OMP_WAIT_POLICY": "ACTIVE", "OPENBLAS_NUM_THREADS": "7"}
    assert configure(1, env=env) == 1
    assert env["NUMBA_NUM_THREADS"] == env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "1"
    assert env["OMP_WAIT_POLICY"] == "ACTIVE"  # a wait policy the user chose stays


def test_default_keeps_what_the_user_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LARQL_THREADS", raising=False)
    env = {"NUMBA_NUM_THREADS": "1"}
    configure(env=env)
    assert env["NUMBA_NUM_THREADS"] == "1" and env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert env["OMP_NUM_THREADS"] == str(available_cores())
    assert env["OPENBLAS_NUM_THREADS"] in ("1", str(available_cores()))  # one when the machine is busy



@pytest.mark.parametrize("reads,busy,taken", [([True] * 8, True, 8), ([True, True, False], False, 3),
                                               ([False], False, 1)])
def test_blas_gets_one_thread_only_when_the_machine_stays_busy(monkeypatch: pytest.MonkeyPatch, reads: list[bool],
                                                                busy: bool, taken: int) -> None:
    """A moment of other work (a pipe's other end starting) leaves BLAS its threads; only a machine
    busy at every read over ~35 ms gets one. An idle machine costs one read."""
    from larql import threads

    seen = iter(reads)
    calls: list[int] = []

    def read(cores: int) -> bool:
        calls.append(cores)
        return next(seen)

    monkeypatch.setattr(threads, "machine_busy", read)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    monkeypatch.delenv("LARQL_THREADS", raising=False)
    env: dict[str, str] = {}
    configure(env=env)
    assert len(calls) == taken
    assert env["OPENBLAS_NUM_THREADS"] == ("1" if busy else str(available_cores()))

def test_env_var_reaches_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    code = ("import json, os; from larql.threads import configure; configure(); import numba; "
            "print(json.dumps([numba.get_num_threads(), os.environ['OMP_WAIT_POLICY']]))")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_THREADS") and k != "OMP_WAIT_POLICY"}
    r = subprocess.run([sys.executable, "-c", code], env={**env, "LARQL_THREADS": "1"}, capture_output=True,
                       text=True, timeout=120)
    assert json.loads(r.stdout) == [1, "PASSIVE"], r.stderr
    monkeypatch.setenv("LARQL_THREADS", "two")
    with pytest.raises(ValueError, match="LARQL_THREADS='two' is not a positive whole number"):
        configure(env={})
