"""The ASGI application: the routes of the route modules assembled, with the shared state
(http.py) and its error handlers; an --ffn-only server has the shard's routes alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute

from larql.errors import LarqlError
from larql.serve.config import ServeConfig
from larql.serve.http import ServerState, http_error, internal_error, larql_error
from larql.serve.sessions import Served


def app_routes(ffn_only: bool = False) -> list[BaseRoute]:
    """Every route of the app: a full server's, or an --ffn-only shard's (the HTTP API page renders
    its table from this list)."""
    if ffn_only:  # the FFN of a layer range and nothing else
        from larql.serve import ffn_remote

        return ffn_remote.routes()
    from larql.serve import attention, console, generation, lql_routes, openai_api

    return (lql_routes.routes() + openai_api.routes() + generation.routes() + attention.routes()
            + console.routes())


def create_app(served: Served, config: ServeConfig | None = None) -> Starlette:
    """The Starlette app serving `served` (see larql/serve/__init__.py for the routes)."""
    server = ServerState(served, config or ServeConfig())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if server.batcher is not None:
            server.batcher.loop = asyncio.get_running_loop()  # worker threads' INFERs reach it through the loop
        yield
        # uvicorn has already let in-flight requests finish (its graceful-shutdown wait)
        server.pool.shutdown(wait=False, cancel_futures=True)
        if server.batcher is not None:
            server.batcher.close()

    if server.config.ffn_only:  # --ffn-only: the FFN of a layer range and nothing else
        from larql.serve import shard

        shard.check_range(server)
    app = Starlette(routes=app_routes(server.config.ffn_only), lifespan=lifespan,
                    exception_handlers={LarqlError: larql_error, HTTPException: http_error,
                                        Exception: internal_error})
    app.state.larql = server
    return app
