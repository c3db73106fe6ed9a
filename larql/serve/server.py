"""Running the app on uvicorn: `serve()` for `larql serve` (in the foreground, stopped by Ctrl-C or
SIGTERM after in-flight requests finish), and `ServerThread` for tests, benchmarks and notebooks."""

from __future__ import annotations

import signal
import socket
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from larql.serve.config import ServeConfig
from larql.serve.sessions import Served, open_served

if TYPE_CHECKING:
    from collections.abc import Callable

    from larql.model.model import Model


def _prepare_numba() -> None:
    """Statements run in several threads at once; numba's default "workqueue" layer aborts the
    process when two threads launch parallel kernels together, so ask for one that is thread-safe
    (OpenMP or TBB) before the first kernel compiles."""
    import numba

    numba.config.THREADING_LAYER = "threadsafe"  # type: ignore[attr-defined]


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free port, read back from the socket)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, and
    # without it every response waits ~40 ms (Nagle holding the body for the client's delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _uvicorn(app: Any, config: ServeConfig, log_level: str) -> Any:
    import uvicorn

    # grace for in-flight requests at shutdown: as long as one request may take
    cfg = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=int(config.limits.timeout_s) + 1,
                         limit_concurrency=1000, ws_max_size=config.limits.max_body_bytes,
                         timeout_keep_alive=30)  # uvicorn's 5 s closes pooled client connections mid-use
    return uvicorn.Server(cfg)


def serve(src: str | Path, host: str = "127.0.0.1", port: int = 8080, config: ServeConfig | None = None,
          log_level: str = "info", wrap: Callable[[Model], Model] | None = None) -> int:
    """Serve a vindex or model until interrupted; prints the URL once it is listening. `wrap`: the
    served model through it first (its FFN on Ray shards: `larql serve --ray`)."""
    from larql.serve.app import create_app

    _prepare_numba()
    config = config or ServeConfig()
    served = open_served(src, wrap)
    sock = bind(host, port)
    server = _uvicorn(create_app(served, config), config, log_level)
    mode = "edits allowed" + (" with a token" if config.token else "") if config.allow_edits else "read-only"
    if config.ffn_layers is not None:
        mode = f"the FFN of layers {config.ffn_layers[0]}-{config.ffn_layers[1]} only"
    if wrap is not None:
        mode += ", the FFN on Ray shards"
    if config.ffn_experts is not None:
        layers = "all layers" if config.ffn_layers is None else f"layers {config.ffn_layers[0]}-{config.ffn_layers[1]}"
        mode = f"experts {config.ffn_experts[0]}-{config.ffn_experts[1]} of {layers} only"
    print(f"larql: serving {served.name} ({served.path}) at {url_of(sock)} ({mode}); Ctrl-C stops", flush=True,
          file=sys.stderr)
    # uvicorn re-raises the signal that stopped it once it has shut down; with these handlers in
    # place that re-raise is a no-op, so a graceful stop exits 0 rather than dying by the signal
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    server.run(sockets=[sock])
    print("larql: server stopped", file=sys.stderr, flush=True)
    return 0


class ServerThread:
    """A server on a loopback port in a background thread of this process.

        with ServerThread(open_served("g.vindex")) as url:
            httpx.get(url + "/v1/health")
    """

    def __init__(self, served: Served, config: ServeConfig | None = None, host: str = "127.0.0.1") -> None:
        from larql.serve.app import create_app

        _prepare_numba()
        self.config = config or ServeConfig()
        self.app = create_app(served, self.config)
        self.sock = bind(host, 0)
        self.url = url_of(self.sock)
        self.server = _uvicorn(self.app, self.config, "warning")
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:  # uvicorn sets it once the socket accepts
            if not self.thread.is_alive():
                raise RuntimeError("the server thread stopped before it started")
            threading.Event().wait(0.01)
        return self.url

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
