"""Decode steps drop to one numba thread on a busy machine (model/busy.py), and only then."""

from __future__ import annotations

import types

import pytest

from larql import threads
from larql.model import busy


class FakeNumba:
    def __init__(self, n: int) -> None:
        self.n, self.calls = n, []

    def get_num_threads(self) -> int:
        return self.n

    def set_num_threads(self, n: int) -> None:
        self.calls.append(n)
        self.n = n


@pytest.mark.parametrize(("rows", "is_busy", "asked", "inside"),
                         [(1, True, False, 1), (16, True, False, 1), (17, True, False, 2), (1, False, False, 2),
                          (1, True, True, 2)])
def test_step_threads(monkeypatch: pytest.MonkeyPatch, rows: int, is_busy: bool, asked: bool, inside: int) -> None:
    fake = FakeNumba(2)
    monkeypatch.setattr(busy, "numba", types.SimpleNamespace(get_num_threads=fake.get_num_threads,
                                                             set_num_threads=fake.set_num_threads))
    monkeypatch.setattr(threads, "machine_busy", lambda cores: is_busy)
    monkeypatch.setattr(threads, "explicit", lambda: asked)
    monkeypatch.setattr(busy, "_seen", [-1.0, False])  # nothing read yet
    with busy.step_threads(rows):
        assert fake.n == inside
    assert fake.n == 2  # restored
    with pytest.raises(RuntimeError), busy.step_threads(rows):
        raise RuntimeError("a failing step restores the count too")
    assert fake.n == 2


def test_explicit_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_explicit", [False])
    monkeypatch.delenv(threads.ENV_VAR, raising=False)
    assert not threads.explicit()
    monkeypatch.setenv(threads.ENV_VAR, "2")
    assert threads.explicit()
    monkeypatch.delenv(threads.ENV_VAR)
    monkeypatch.setattr(threads, "_explicit", [True])  # what configure(n) records for --threads n
    assert threads.explicit()


def test_the_load_is_read_at_most_every_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two decode steps' four checks within RECHECK_S read /proc/loadavg once; a later one reads it again."""
    fake = FakeNumba(2)
    monkeypatch.setattr(busy, "numba", types.SimpleNamespace(get_num_threads=fake.get_num_threads,
                                                             set_num_threads=fake.set_num_threads))
    reads: list[int] = []
    monkeypatch.setattr(threads, "machine_busy", lambda cores: reads.append(cores) or True)
    monkeypatch.setattr(threads, "explicit", lambda: False)
    clock = [100.0]
    monkeypatch.setattr(busy.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(busy, "_seen", [-1.0, False])
    for _ in range(4):
        with busy.step_threads(1):
            assert fake.n == 1
    assert len(reads) == 1
    clock[0] += 2 * busy.RECHECK_S
    with busy.step_threads(1):
        pass
    assert len(reads) == 2
