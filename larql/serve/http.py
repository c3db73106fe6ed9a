"""The HTTP pieces every route module shares: the server's state (served model, sessions, config,
the thread pool work runs in), JSON in and out, request bodies under the size limit, errors as JSON
and the bearer token.

Every error a client causes answers `{"error": {"type", "message", ...}}` with the message the CLI
prints (an LQL error keeps its `line:col`, source line and caret); anything else is a 500 whose
traceback stays in the server's log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response

from larql.errors import LarqlError, LimitError, LqlError, ServeError
from larql.serve.batcher import Batcher
from larql.serve.config import ServeConfig
from larql.serve.sessions import (
    SESSION_COOKIE,
    SESSION_HEADER,
    ClientSession,
    Served,
    Sessions,
)

log = logging.getLogger("larql.serve")
T = TypeVar("T")


class LarqlJSON(JSONResponse):
    """JSON as `larql lql --json` writes it: UTF-8 as is, anything else (numpy scalars) as str."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, default=str).encode("utf-8")


class ServerState:
    """What every request shares: the served vindex or model, the sessions, the config, the pool."""

    def __init__(self, served: Served, config: ServeConfig) -> None:
        self.served, self.config = served, config
        self.sessions = Sessions(served, config.limits.max_sessions, config.limits.session_idle_s)
        self.pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="larql-work")
        self.started = time.time()
        self.queued = 0  # touched on the event loop only: no lock
        self.chat: Any = None  # the served model's ChatTemplate, found at the first chat request
        self.batcher: Batcher | None = None  # next-token passes of the shared model, batched
        if config.batch > 0 and served.model is not None and not config.ffn_only:
            self.batcher = Batcher(config.batch_window_ms / 1000, config.batch, config.batch_rows, config.solo_rows,
                                   max_waiting=4 * config.limits.max_queued, solo_pool=self.pool)

    async def run(self, fn: Callable[..., T], *args: Any, deadline: float | None = None) -> T:
        """Run blocking work (numba, numpy, the tokenizer) in the pool, not on the event loop.

        Past the deadline the client gets a 504 at once; the statement itself cannot be stopped
        mid-kernel, so it finishes in its thread and its answer is dropped."""
        if self.queued >= self.config.limits.max_queued:  # shed load rather than queue without end
            raise LimitError(f"the server is busy ({self.queued} requests at work or waiting); try again",
                             status=503)
        self.queued += 1
        fut = asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        fut.add_done_callback(self._done)
        if deadline is None:
            return await fut
        try:
            return await asyncio.wait_for(fut, max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise self.too_slow() from None

    def too_slow(self) -> LimitError:
        return LimitError(f"the request took longer than this server's limit of {self.config.limits.timeout_s:g} s",
                          status=504)

    def _done(self, fut: asyncio.Future[Any]) -> None:
        self.queued -= 1  # done, or cancelled at the deadline while still waiting for a thread

    def deadline(self) -> float:
        return time.monotonic() + self.config.limits.timeout_s

    def session_of(self, conn: HTTPConnection) -> ClientSession | None:
        """The client's session named by its header or cookie (None when it names none)."""
        sid = conn.headers.get(SESSION_HEADER) or conn.cookies.get(SESSION_COOKIE)
        return self.sessions.get(sid) if sid else None


def state(conn: HTTPConnection) -> ServerState:
    return conn.app.state.larql


def bearer(conn: HTTPConnection) -> str | None:
    auth = conn.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


async def read_json(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, refused past the body limit before it is all read."""
    limit = state(request).config.limits.max_body_bytes
    declared = request.headers.get("content-length")
    too_big = LimitError(f"the request body is over this server's limit of {limit:,} bytes")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_big
    try:
        data = json.loads(body or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ServeError(f"the request body is not JSON ({e})") from e
    if not isinstance(data, dict):
        raise ServeError("the request body must be a JSON object")
    return data


# routes a client of OpenAI's API calls: their errors come in OpenAI's shape
OPENAI_PATHS = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings")


def error_body(e: Exception, openai: bool = False) -> dict[str, Any]:
    """`{"type", "message"}` plus, for an LQL error, its parts (so a client can locate it itself);
    with `openai`, OpenAI's `{"message", "type", "param", "code"}` (param: the request field at fault)."""
    err: dict[str, Any] = {"type": type(e).__name__, "message": str(e)}
    if openai:
        err.update(param=getattr(e, "param", None), code=getattr(e, "code", None))
    if isinstance(e, LqlError):
        err.update(detail=e.message, hint=e.hint, line=e.line, column=e.column)
    return {"error": err}


def is_openai(conn: HTTPConnection) -> bool:
    return conn.url.path.startswith(OPENAI_PATHS)


def status_of(e: LarqlError) -> int:
    return e.status if isinstance(e, ServeError) else 400


async def larql_error(request: Request, e: Exception) -> Response:
    assert isinstance(e, LarqlError)
    return LarqlJSON(error_body(e, is_openai(request)), status_code=status_of(e))


async def http_error(request: Request, e: Exception) -> Response:
    assert isinstance(e, HTTPException)
    kind = {404: "NotFound", 405: "MethodNotAllowed"}.get(e.status_code, "HTTPError")
    err: dict[str, Any] = {"type": kind, "message": f"{request.method} {request.url.path}: {e.detail}"}
    if is_openai(request):
        err.update(param=None, code=None)
    return LarqlJSON({"error": err}, status_code=e.status_code)


async def read_body(request: Request, server: ServerState) -> bytes:
    """The request's raw body (an FFN shard's float32 rows), refused once it grows past the body limit."""
    limit = server.config.limits.max_body_bytes
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise LimitError(f"the request body is over this server's limit of {limit:,} bytes")
    return body


async def internal_error(request: Request, e: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path, exc_info=e)
    return LarqlJSON({"error": {"type": "InternalError", "message": f"{type(e).__name__}: {e}"}}, status_code=500)
