"""A served session's INSERT holds the float32 weights for its own length only: they are the served
model's, shared by every session, and one client's edit must not grow the server for good."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from larql.edit.view import edit_vindex
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
