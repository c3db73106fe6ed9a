"""OpenAI-compatible completions and the token WebSocket (step 2)."""

from __future__ import annotations

from starlette.routing import BaseRoute


def routes() -> list[BaseRoute]:
    return []
