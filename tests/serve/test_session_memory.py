"""A served session's INSERT holds the float32 weights for its own length only: they are the served
model's, shared by every session, and one client's edit must not grow the server for good. A session
dropped over HTTP leaves nothing behind, and the key statistics are computed once for every session
(tests/parity/test_session_memory.py measures a real `larql serve` process on Gemma)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from larql.edit.methods.metrics import _metrics, _metrics_of
from larql.edit.state.view import edit_vindex
from larql.serve.config import ServeConfig
from larql.serve.server import ServerThread
from larql.serve.sessions import Sessions, open_served


def test_a_session_keeps_no_float32_weights_a_local_view_does(infer_vx: Path) -> None:
    served = open_served(infer_vx)
    session = Sessions(served).create()
    got = session.view.float32_weights()
    gate = served.model.weights.layers[0].gate  # type: ignore[union-attr]
    assert got and any(np.shares_memory(a, gate.dense()) for a in got)  # the served model's own weights
    assert session.view._float32_weights == []  # nothing kept past the caller
    local = edit_vindex(infer_vx)
    kept = local.float32_weights()
    assert kept and local.float32_weights() is kept  # an editing session of its own keeps them


INSERT = ('INSERT INTO EDGES (entity, relation, target, prompt) VALUES ("zeta", "colour", "blue", "Colour of zeta") '
          'METHOD {}')


def test_sessions_dropped_over_http_leave_nothing_behind(infer_vx: Path) -> None:
    served = open_served(infer_vx)
    thread = ServerThread(served, ServeConfig(root=infer_vx.parent, allow_edits=True))
    sessions = thread.app.state.larql.sessions
    before, held, stats = set(_metrics), [], []
    with thread as url:
        for method in ("NEURON", "ROME", "NEURON", "ROME"):
            r = httpx.post(f"{url}/v1/lql", json={"query": INSERT.format(method)}, timeout=120)
            assert r.status_code == 200, r.text
            sid = r.headers["x-larql-session"]
            view = sessions.get(sid).view
            held += [weakref.ref(view), weakref.ref(view.model())]
            stats.append(dict(_metrics_of(served.model)))
            del view
            assert httpx.delete(f"{url}/v1/session", headers={"X-Larql-Session": sid}).status_code == 200
    gc.collect()
    alive: list[Any] = [ref() for ref in held if ref() is not None]
    assert not alive, [type(x).__name__ for x in alive]
    # every session's model is the served weights with its own overlay: one entry, each statistic made once
    assert set(_metrics) - before <= {id(served.model.weights)} and stats[0].keys() < stats[1].keys()
    assert stats[2] == stats[3] == stats[1] and all(stats[3][k] is got for k, got in stats[1].items())
