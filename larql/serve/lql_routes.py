"""/v1/health, /v1/info, /v1/lql and the REST shortcuts (describe, walk, infer, trace).

/v1/lql answers `{"results": [...]}`, each item the object `larql lql --json` prints for a result.
A shortcut builds the statement from its parameters and answers that one object.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from larql.errors import LarqlError, LimitError, ServeError
from larql.lql import ast
from larql.lql.parser import parse
from larql.lql.unparse import unparse
from larql.serve.guard import check_request, stages
from larql.serve.http import (
    LarqlJSON,
    ServerState,
    bearer,
    error_body,
    read_json,
    state,
    status_of,
)
from larql.serve.sessions import (
    SESSION_COOKIE,
    SESSION_HEADER,
    ClientSession,
    describe_view,
)
from larql.version import __version__


async def health(request: Request) -> Response:
    return LarqlJSON({"status": "ok", "version": __version__})


async def info(request: Request) -> Response:
    server = state(request)
    served = server.served
    sess = server.session_of(request)
    out: dict[str, Any] = {"model": served.name, "path": str(served.path), "version": __version__,
                           "allow_edits": server.config.allow_edits, "token_required": server.config.token is not None,
                           "limits": vars(server.config.limits), "session": sess.id if sess else None}
    if served.base is not None:
        i = served.base.index
        out.update(kind="vindex", layers=i["num_layers"], features=sum(e["num_features"] for e in i["layers"]),
                   hidden=i["hidden_size"], vocab=i["vocab_size"], level=i["extract_level"], dtype=i["dtype"],
                   quant=i["quant"], model_weights=bool(i["has_model_weights"]))
    else:
        assert served.model is not None
        c = served.model.config
        out.update(kind="model", layers=c.n_layers, hidden=c.hidden, vocab=c.vocab, level="model", model_weights=True)
    out.update(describe_view(sess.view if sess else served.base))
    out["batching"] = None if server.batcher is None else {
        "max_batch": server.batcher.max_batch, "max_rows": server.batcher.max_rows,
        "solo_rows": server.batcher.solo_rows, "window_ms": server.batcher.window_s * 1e3,
        **server.batcher.stats.to_json()}
    if served.model is not None:
        from larql.serve.generation import template

        out["chat_template"] = (await server.run(template, server)).origin
    return LarqlJSON(out)


def _run_statements(server: ServerState, statements: list[ast.Statement], source: str,
                    sess: ClientSession | None, deadline: float) -> tuple[list[dict[str, Any]], Exception | None]:
    """Run the statements in order (in a pool thread) and return their results as JSON objects,
    and the error that stopped them, if one did (the results before it are kept)."""
    from larql.lql.executor import (
        run_statement,  # the runtime (numba) loads when a statement runs
    )
    from larql.lql.session import Session

    def too_slow(*_: Any) -> None:  # called at long statements' progress points
        if time.monotonic() > deadline:
            raise server.too_slow()

    served = server.served
    view = sess.view if sess is not None else served.base
    session = Session(vindex=view, model=None if served.vindex else served.model, source=source, progress=too_slow)
    if sess is None and server.batcher is not None:  # INFER on the shared model: batched with other clients'
        batcher = server.batcher

        def batched(m: Any, ids: list[int]) -> Any:
            try:
                return batcher.next_logits_from_thread(m, ids, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise server.too_slow() from None

        session.next_logits = batched
    out: list[dict[str, Any]] = []
    if sess is not None:
        sess.lock.acquire()  # one request at a time edits (or reads) a session's overlay
    try:
        for stmt in statements:
            too_slow()
            out += [r.to_json() for r in run_statement(stmt, session)]
    except LarqlError as e:
        return out, e
    finally:
        if sess is not None:
            sess.lock.release()
    return out, None


async def run_text(request: Request, text: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Parse, check and run LQL text for this client: its results and the headers to send back.

    Raises the error that stopped it as a ServeError carrying the results before it."""
    server = state(request)
    statements = parse(text)
    limit = server.config.limits.max_statements
    if len(statements) > limit:
        raise LimitError(f"{len(statements)} statements in one request; this server runs at most {limit}")
    anchored, wants_write = check_request(statements, text, root=server.config.root,
                                          allow_edits=server.config.allow_edits, token=server.config.token,
                                          bearer=bearer(request))
    sess = server.session_of(request)
    headers: dict[str, str] = {}
    if sess is None and wants_write and server.served.vindex:
        sess = server.sessions.create()  # the client's first write: its own overlay from now on
        headers[SESSION_HEADER] = sess.id
        headers["set-cookie"] = f"{SESSION_COOKIE}={sess.id}; Path=/; HttpOnly; SameSite=Strict"
    deadline = server.deadline()
    results, err = await server.run(_run_statements, server, anchored, text, sess, deadline, deadline=deadline)
    # each result names its statement as the client wrote it, not with the paths anchored
    written = {unparse(a): unparse(s) for st, at in zip(statements, anchored)
               for s, a in zip(stages(st), stages(at))}
    for r in results:
        r["statement"] = written.get(r["statement"], r["statement"])
    if err is not None:
        raise PartialError(err, results, headers)
    return results, headers


class PartialError(ServeError):
    """An error after some statements ran: answered with their results beside the error."""

    def __init__(self, cause: Exception, results: list[dict[str, Any]], headers: dict[str, str]) -> None:
        super().__init__(str(cause), status_of(cause) if isinstance(cause, LarqlError) else 500)
        self.cause, self.results, self.headers = cause, results, headers

    def response(self) -> Response:
        return LarqlJSON({**error_body(self.cause), "results": self.results}, status_code=self.status,
                         headers=self.headers)


async def lql(request: Request) -> Response:
    body = await read_json(request)
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ServeError('the body needs "query": LQL text, e.g. {"query": "DESCRIBE \\"France\\""}')
    try:
        results, headers = await run_text(request, query)
    except PartialError as e:
        return e.response()
    sess = headers.get(SESSION_HEADER) or (request.headers.get(SESSION_HEADER) or request.cookies.get(SESSION_COOKIE))
    return LarqlJSON({"results": results, "session": sess}, headers=headers)


async def drop_session(request: Request) -> Response:
    server = state(request)
    sess = server.session_of(request)
    if sess is None:
        raise ServeError(f"no session named: send the {SESSION_HEADER} header (or the {SESSION_COOKIE} cookie)")
    server.sessions.drop(sess.id)
    return LarqlJSON({"dropped": sess.id})


# ---- REST shortcuts ------------------------------------------------------------------------------

def _int(params: dict[str, Any], key: str) -> int | None:
    v = params.get(key)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ServeError(f"{key} must be an integer, got {v!r}") from None


def _range(params: dict[str, Any], key: str = "layers") -> ast.Range | None:
    v = params.get(key)
    if v is None or v == "":
        return None
    lo, _, hi = str(v).partition("-")
    try:
        return ast.Range(int(lo), int(hi or lo))
    except ValueError:
        raise ServeError(f"{key} must be a layer range such as 2-5, got {v!r}") from None


def _text(params: dict[str, Any], key: str) -> str:
    v = params.get(key)
    if not isinstance(v, str) or not v:
        raise ServeError(f"the parameter {key!r} is required")
    return v


def _flag(params: dict[str, Any], key: str) -> bool:
    return str(params.get(key, "")).lower() in ("1", "true", "yes")


SHORTCUTS = {
    "describe": lambda p: ast.DescribeStmt(_text(p, "entity"), band=p.get("band") or None, at_layer=_int(p, "layer"),
                                           relations_only=_flag(p, "relations_only"),
                                           mode="verbose" if _flag(p, "verbose") else p.get("mode") or None),
    "walk": lambda p: ast.WalkStmt(_text(p, "prompt"), top=_int(p, "top"), layers=_range(p)),
    "infer": lambda p: ast.InferStmt(_text(p, "prompt"), top=_int(p, "top")),
    "trace": lambda p: ast.TraceStmt(_text(p, "prompt"), for_token=p.get("for") or None,
                                     decompose=_flag(p, "decompose"), layers=_range(p),
                                     positions=p.get("positions") or None),
}


def shortcut(verb: str) -> Any:
    """GET with query parameters or POST with a JSON object: the statement's one result."""

    async def endpoint(request: Request) -> Response:
        params: dict[str, Any] = dict(request.query_params)
        if request.method == "POST":
            params.update(await read_json(request))
        try:
            results, headers = await run_text(request, unparse(SHORTCUTS[verb](params)))
        except PartialError as e:
            return e.response()
        return LarqlJSON(results[0], headers=headers)

    return endpoint


def routes() -> list[BaseRoute]:
    return [Route("/v1/health", health), Route("/v1/info", info), Route("/v1/lql", lql, methods=["POST"]),
            Route("/v1/session", drop_session, methods=["DELETE"]),
            *(Route(f"/v1/{verb}", shortcut(verb), methods=["GET", "POST"]) for verb in SHORTCUTS)]
