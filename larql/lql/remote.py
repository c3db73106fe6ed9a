"""USE REMOTE "http://host:port": statements run on a `larql serve` server and come back as the
Results a local vindex gives, so the REPL, `larql lql` and Python render them exactly as local.

Each statement is sent as its canonical text to POST /v1/lql. The server's session id (issued at
the first write) is kept and sent back, so this client's edits stay in its own overlay on the
server; writes carry `Authorization: Bearer $LARQL_TOKEN` when that variable is set. An error the
server reports is raised here at the statement's place in the local text.
"""

from __future__ import annotations

import os
from typing import Any

from larql.errors import (
    LqlError,
    LqlSemanticError,
    LqlSyntaxError,
    RemoteError,
    ServeError,
)
from larql.lql import ast
from larql.lql.result import Result
from larql.lql.unparse import unparse

RESULT_FIELDS = ("statement", "title", "columns", "rows", "notes", "elapsed_ms")


class Remote:
    """A connection to a larql server: its /v1/info, this client's session id, an HTTP client."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 600.0) -> None:
        try:
            import httpx
        except ImportError as e:
            raise ServeError("USE REMOTE needs httpx: pip install 'larql[serve]'") from e
        self.url = url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise ServeError(f"{url}: USE REMOTE takes an http:// or https:// URL")
        self.token = token if token is not None else os.environ.get("LARQL_TOKEN") or None
        self.session_id: str | None = None
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        self.info = self._call("GET", "/v1/info")[1]

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        import httpx

        headers = {}
        if self.session_id:
            headers["X-Larql-Session"] = self.session_id
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            r = self._http.request(method, path, json=body, headers=headers)
        except httpx.HTTPError as e:
            raise RemoteError(f"{self.url}: cannot reach the server ({e})") from e
        try:
            data = r.json()
        except ValueError:
            raise RemoteError(f"{self.url}{path}: answered HTTP {r.status_code} with something that is not "
                              f"JSON: is it a larql server?") from None
        if not isinstance(data, dict):
            raise RemoteError(f"{self.url}{path}: answered JSON that is not an object: is it a larql server?")
        self.session_id = r.headers.get("x-larql-session", self.session_id)
        if "error" in data and not isinstance(data["error"], dict):
            raise RemoteError(f"{self.url}{path}: answered a malformed error")
        return r.status_code, data

    def describe(self) -> str:
        i = self.info
        size = f"{i.get('layers')} layers" + (f", {i['features']:,} features" if "features" in i else "")
        return f"{self.url} ({size}, model: {i.get('model')}, level: {i.get('level')})"

    def run(self, stmt: ast.Statement, source: str) -> list[Result]:
        """Run one statement on the server; its results, or its error raised at `stmt` in `source`."""
        status, data = self._call("POST", "/v1/lql", {"query": unparse(stmt)})
        if "error" in data:
            raise self._located(data["error"], status, stmt, source)
        try:
            return [Result(**{k: r[k] for k in RESULT_FIELDS}) for r in data["results"]]
        except (KeyError, TypeError) as e:
            raise RemoteError(f"{self.url}/v1/lql: answered results without {e}: is it a larql server?") from e

    def _located(self, err: dict[str, Any], status: int, stmt: ast.Statement, source: str) -> LqlError:
        line, column = stmt.span.line, stmt.span.column
        if "detail" in err:  # an LQL error: the same message and hint, at the statement here
            cls = LqlSyntaxError if err.get("type") == "LqlSyntaxError" else LqlSemanticError
            return cls(str(err["detail"]), source, line, column, str(err.get("hint") or ""))
        return LqlSemanticError(f"{self.url}: {err.get('message', f'HTTP {status}')}", source, line, column,
                                "set LARQL_TOKEN to the server's token" if status == 401 else "")

    def close(self) -> None:
        self._http.close()
