"""What a server serves, and each client's own edits.

Every client reads the one store (memory-mapped once). Clients that never write share one view with
an empty overlay; a client's first write gives it a session: a view of its own over the same store,
whose overlay and patch stack hold its edits and nobody else's. Its model shares the weights and
tokenizer of the served model, with the session's overlay as the FFN's edits, so a session costs an
overlay, not a copy of the model.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from larql.edit.state.view import EditableVindex
from larql.errors import LimitError, ServeError

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np
    from numpy.typing import NDArray

    from larql.model.model import Model
    from larql.vindex.store import Vindex

SESSION_HEADER = "X-Larql-Session"
SESSION_COOKIE = "larql_session"


class SessionView(EditableVindex):
    """An editable view whose model is the served model with this view's overlay as its edits
    (EditableVindex.model() would build a second Model over the same weights per client)."""

    def __init__(self, store: Vindex, shared: Model | None) -> None:
        super().__init__(store)
        self._shared = shared

    def model(self) -> Model:
        if self._shared is None:
            return super().model()  # browse level: raises the usual "no model weights" error
        if self._model is None:
            from larql.edit.state.walk_ffn import OverlayEdits

            self._model = self._shared.with_edits(OverlayEdits(self.overlay))
        return self._model

    def float32_weights(self) -> list[NDArray[np.float32]]:
        """The float32 weights for one INSERT's length only: they are the served model's, shared by
        every session, and a client's edit must not grow the server by a float32 copy for good."""
        if self._shared is None:
            return super().float32_weights()
        from larql.model.weights import float32_copies

        return float32_copies(self.model().weights)


@dataclass
class Served:
    """The vindex (or, with no vindex, the model) a server answers for."""

    name: str
    path: Path
    base: EditableVindex | None  # the shared, never edited view (None when serving a model)
    model: Model | None  # the model generation and INFER run (None for a browse-level vindex)

    @property
    def vindex(self) -> bool:
        return self.base is not None


def open_served(src: str | Path, wrap: Callable[[Model], Model] | None = None) -> Served:
    """Open a vindex directory (its carried model too, when it has weights) or load a model; `wrap`
    takes the model first (an FFN computed elsewhere), and every session's model keeps it."""
    import larql
    from larql.model.load import resolve

    _, path = resolve(src)
    if path.is_dir() and (path / "index.json").is_file():
        store = larql.open_vindex(path)
        view = SessionView(store, None)
        model = view.model() if store.has_model_weights else None  # built once, shared by every session
        if wrap is not None and model is not None:
            view = SessionView(store, wrap(model))  # its model: the wrapped one over this view's overlay
            model = view.model()
        return Served(str(store.index["model"]), store.path, view, model)
    model = larql.load(src)
    return Served(model.name, Path(model.source), None, wrap(model) if wrap is not None else model)


@dataclass
class ClientSession:
    id: str
    view: SessionView
    lock: threading.Lock = field(default_factory=threading.Lock)  # one statement at a time per overlay
    last_used: float = field(default_factory=time.monotonic)


class UnknownSession(ServeError):
    """A session id this server does not hold (never issued, dropped, or idle too long)."""

    status = 404


class Sessions:
    """The clients' sessions, at most `limit`, each dropped after `idle_seconds` unused."""

    def __init__(self, served: Served, limit: int = 32, idle_seconds: float = 3600.0) -> None:
        self.served, self.limit, self.idle_seconds = served, limit, idle_seconds
        self._by_id: dict[str, ClientSession] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, sid: str) -> ClientSession:
        with self._lock:
            self._expire()
            s = self._by_id.get(sid)
            if s is None:
                raise UnknownSession(f"unknown session {sid[:12]!r}: it expired or was never issued; send the "
                                     f"request without the {SESSION_HEADER} header to start a new one")
            s.last_used = time.monotonic()
            return s

    def create(self) -> ClientSession:
        base = self.served.base
        assert base is not None  # writes need a vindex; the planner says so before this is reached
        with self._lock:
            self._expire()
            if len(self._by_id) >= self.limit:
                raise LimitError(f"this server holds {self.limit} sessions already; try again when one has been "
                                 f"idle {self.idle_seconds:.0f} s, or DELETE /v1/session to drop yours", status=503)
            s = ClientSession(secrets.token_urlsafe(18), SessionView(base.store, self.served.model))
            self._by_id[s.id] = s
            return s

    def drop(self, sid: str) -> bool:
        with self._lock:
            return self._by_id.pop(sid, None) is not None

    def _expire(self) -> None:
        now = time.monotonic()
        for sid in [k for k, s in self._by_id.items() if now - s.last_used > self.idle_seconds and not s.lock.locked()]:
            del self._by_id[sid]


def describe_view(view: EditableVindex | None) -> dict[str, Any]:
    """The patch state /v1/info reports for a view."""
    if view is None:
        return {"patches": [], "edited_features": 0, "unsaved_edits": 0}
    stack = view.patches
    return {"patches": [p.name for p in stack.applied], "edited_features": len(view.overlay),
            "unsaved_edits": len(stack.pending)}
