"""The browser console at `/`: static HTML, JS and CSS shipped in the package (larql/serve/console/,
no build step, nothing fetched from elsewhere), and the two routes its editor completes with.

    GET  /                      the console page
    GET  /console/{file}        its script and style sheet
    GET  /v1/lql/keywords       {"keywords": [...]}: every keyword of the LQL grammar
    POST /v1/lql/complete {"text": "..."}   {"suggestions": [{"text", "start", "kind"}]}: what the
                                grammar accepts after the text (the REPL's completion), entities
                                from the served vocabulary inside quotes

The page only talks to this server's /v1 API, so what it shows is what `larql lql --json` prints;
the charts are drawn by the page (inline SVG) from those rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from larql.errors import ServeError
from larql.lql.complete import complete as complete_text
from larql.lql.parser import lark_parser
from larql.serve.http import LarqlJSON, ServerState, read_json, state

STATIC = Path(__file__).with_name("console")
# the page and its files come from this server only: no inline script, no CDN
HEADERS = {"content-security-policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
                                      "base-uri 'none'; frame-ancestors 'none'",
           "x-content-type-options": "nosniff", "cache-control": "no-cache"}
MAX_TEXT = 10_000  # characters of editor text a completion request looks at


@cache
def keywords() -> list[str]:
    """The grammar's keyword terminals (string patterns of letters), upper case, sorted."""
    return sorted({str(t.pattern.value).upper() for t in lark_parser().terminals
                   if t.pattern.type == "str" and str(t.pattern.value).replace("_", "").isalpha()})


_lookup_lock = threading.Lock()


def _entities(server: ServerState) -> Callable[[str], list[str]] | None:
    """The served vocabulary's entity lookup, built at the first completion inside quotes (about a
    second for a 262k vocabulary) and kept."""
    from larql.lql.complete import vocabulary_lookup

    with _lookup_lock:
        found: Callable[[str], list[str]] | None = getattr(server, "entity_lookup", None)
        if found is None:
            served = server.served
            tok = served.base.tokenizer if served.base is not None else served.model.tokenizer if served.model else None
            if tok is None:
                return None
            found = vocabulary_lookup(tok.tok.get_vocab())
            server.entity_lookup = found  # type: ignore[attr-defined]
        return found


def _suggest(server: ServerState, text: str) -> list[dict[str, Any]]:
    lookup = _entities(server)
    # no path completion: it would list the server's files; a path in a statement is relative to the root anyway
    found = complete_text(text, lookup, cwd=str(server.config.root), limit=30)
    return [{"text": s.text, "start": s.start, "kind": s.kind} for s in found if s.kind != "path"]


async def page(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", headers=HEADERS)


async def keyword_list(request: Request) -> Response:
    return LarqlJSON({"keywords": keywords()})


async def completions(request: Request) -> Response:
    body = await read_json(request)
    text = body.get("text")
    if not isinstance(text, str):
        raise ServeError('the body needs "text": the editor\'s text before the cursor')
    server = state(request)
    suggestions = await server.run(_suggest, server, text[-MAX_TEXT:], deadline=server.deadline())
    return LarqlJSON({"suggestions": suggestions})


class _Static(StaticFiles):
    """The console's files, with the page's headers."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(HEADERS)
        return response


def routes() -> list[BaseRoute]:
    return [Route("/", page), Route("/v1/lql/keywords", keyword_list),
            Route("/v1/lql/complete", completions, methods=["POST"]),
            Mount("/console", app=_Static(directory=STATIC), name="console")]
