"""larql.threads: the thread-pool environment the CLI sets before numpy loads."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from larql.threads import available_cores, configure


def test_explicit_count_sets_every_pool_and_keeps_the_users_wait_policy() -> None:
    env: dict[str, str] = {"OMP_WAIT_POLICY": "ACTIVE", "OPENBLAS_NUM_THREADS": "7"}
    assert configure(1, env=env) == 1
    assert env["NUMBA_NUM_THREADS"] == env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "1"
    # a wait policy the user chose stays, and no spin count overrides it
    assert env["OMP_WAIT_POLICY"] == "ACTIVE" and "GOMP_SPINCOUNT" not in env
    env = {"GOMP_SPINCOUNT": "0"}
    configure(1, env=env)
    assert env["GOMP_SPINCOUNT"] == "0" and "OMP_WAIT_POLICY" not in env


def test_default_keeps_what_the_user_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LARQL_THREADS", raising=False)
    env = {"NUMBA_NUM_THREADS": "1"}
    configure(env=env)
    # a short spin, not a passive wait (threads.py: passive halved decode speed)
    assert env["NUMBA_NUM_THREADS"] == "1" and env["GOMP_SPINCOUNT"] == "3000" and "OMP_WAIT_POLICY" not in env
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
            "print(json.dumps([numba.get_num_threads(), os.environ['GOMP_SPINCOUNT']]))")
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_THREADS") and k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    r = subprocess.run([sys.executable, "-c", code], env={**env, "LARQL_THREADS": "1"}, capture_output=True,
                       text=True, timeout=120)
    assert json.loads(r.stdout) == [1, "3000"], r.stderr
    monkeypatch.setenv("LARQL_THREADS", "two")
    with pytest.raises(ValueError, match="LARQL_THREADS='two' is not a positive whole number"):
        configure(env={})


def test_user_environ_is_the_environment_before_configure() -> None:
    """What a peer engine's child process gets (larql bench's llama.cpp): the values the user had,
    not the ones configure() set for larql's own pools."""
    code = ("import json, os; from larql.threads import configure, user_environ; configure(); "
            "u = user_environ(); keys = ('GOMP_SPINCOUNT', 'OMP_NUM_THREADS', 'NUMBA_NUM_THREADS', 'KEEP'); "
            "print(json.dumps([[os.environ.get(k) for k in keys], [u.get(k) for k in keys]]))")
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_THREADS") and k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    r = subprocess.run([sys.executable, "-c", code], env={**env, "LARQL_THREADS": "1", "OMP_NUM_THREADS": "5",
                                                           "KEEP": "x"}, capture_output=True, text=True, timeout=120)
    ours, users = json.loads(r.stdout)
    assert ours == ["3000", "1", "1", "x"], r.stderr
    assert users == [None, "5", None, "x"]


def _imports_numpy(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "numpy" for a in node.names)
    return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "numpy"


def _calls_configure(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) in ("configure", "larql.threads.configure"))


def test_benchmarks_configure_threads_before_numpy_loads() -> None:
    # OpenBLAS sizes its pool when numpy is imported: a benchmark that imports numpy before its
    # configure() runs BLAS on every core on a busy machine (2-3x slower edit scoring at load 6)
    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    late = []
    for path in sorted(bench.glob("*.py")):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        at = next((i for i, node in enumerate(body) if _calls_configure(node)), None)
        if at is not None and any(_imports_numpy(node) for node in body[:at]):
            late.append(path.name)
    assert late == []
