"""OpenAI-compatible /v1/completions and /v1/chat/completions (SSE with "stream": true), and the
token WebSocket /v1/stream.

Generation runs the served model; a client with a session runs it with its own overlay, so its
edits show in its completions. Each token is one step in the worker pool (the forward pass holds
no lock on the event loop); a stream stops at the model's stop token, a "stop" string, max_tokens,
the client going away, or a {"type": "cancel"} frame on the WebSocket.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from larql.errors import LarqlError, LimitError, ServeError
from larql.model.chat_template import ChatTemplate, find_template
from larql.model.generate import SamplingParams, sample
from larql.serve.http import LarqlJSON, ServerState, error_body, read_json, state
from larql.serve.sessions import ClientSession

if TYPE_CHECKING:
    from larql.model.model import Model


@dataclass
class Ask:
    """One generation request, checked: the prompt's ids and the sampling parameters."""

    ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    used: int = 0  # tokens generated so far
    finish: str = "stop"  # stop | length | cancelled


def _number(body: dict[str, Any], key: str, default: Any, kind: type, low: float, high: float) -> Any:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise ServeError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    if not low <= v <= high:
        raise ServeError(f"{key} must be between {low:g} and {high:g}, got {v}")
    return kind(v)


def template(server: ServerState) -> ChatTemplate:
    """The served model's chat template, found once."""
    served = server.served
    if server.chat is None:
        assert served.model is not None
        server.chat = find_template(served.model, served.path, served.base.index if served.base else None)
    return server.chat


def parse_ask(server: ServerState, body: dict[str, Any], chat: bool, default_tokens: int) -> Ask:
    """Check an OpenAI-style body and tokenize its prompt (raises ServeError / LimitError)."""
    model = server.served.model
    if model is None:
        raise ServeError("this vindex is browse-level: generation needs model weights (extract it WITH INFERENCE)")
    if _number(body, "n", 1, int, 1, 1) != 1 or body.get("logprobs") or body.get("echo"):
        raise ServeError("n > 1, logprobs and echo are not supported")
    limit = server.config.limits.max_tokens
    default_tokens = min(default_tokens, limit)  # only a max_tokens the client asked for can be over the limit
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", default_tokens))
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > limit:
        raise LimitError(f"max_tokens {max_tokens} is over this server's limit of {limit}", status=400)
    ask = Ask([], _number({"max_tokens": max_tokens}, "max_tokens", default_tokens, int, 1, limit),
              _number(body, "temperature", 1.0, float, 0.0, 2.0), _number(body, "top_p", 1.0, float, 1e-9, 1.0),
              _number(body, "top_k", 0, int, 0, 1 << 20), _number(body, "seed", None, int, 0, 2**63 - 1))
    stop = body.get("stop") or []
    ask.stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(ask.stop, list) or len(ask.stop) > 4 or not all(isinstance(s, str) and s for s in ask.stop):
        raise ServeError("stop must be a string or a list of at most 4 non-empty strings")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise ServeError('messages must be a non-empty list of {"role": ..., "content": "text"}')
        ask.ids = template(server).render(model, messages)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ServeError("prompt must be a string (one prompt per request)")
        ask.ids = model.tokenize(prompt)
    model.check_fits(ask.ids, ask.max_tokens)
    return ask


class StopScan:
    """Cuts the text at the first stop string, holding back any tail that could begin one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops, self.held = stops, ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """(text safe to send now, whether a stop string was reached)."""
        text = self.held + piece
        cuts = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.held = ""
            return text[:min(cuts)], True
        keep = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


def _step(it: Iterator[tuple[int, str]], sess: ClientSession | None) -> tuple[int, str] | None:
    if sess is None:
        return next(it, None)
    with sess.lock:  # the session's overlay may not change under a forward pass
        return next(it, None)


class Decode:
    """One generation stepped by the server's batcher: what `Model.stream` keeps between tokens."""

    def __init__(self, model: Model, ask: Ask) -> None:
        self.model, self.feed, self.new, self.emitted = model, list(ask.ids), list[int](), ""
        self.params = SamplingParams(ask.temperature, ask.top_k, ask.top_p, ask.seed)
        self.rng = np.random.default_rng(ask.seed)
        self.cache = model.new_cache(len(ask.ids) + ask.max_tokens)

    def after(self, logits: NDArray[np.float32]) -> tuple[int, str]:
        """The next (token id, newly decodable text) from the logits after `feed` (in the batch's thread)."""
        tok = sample(logits, self.params, self.rng)
        self.new.append(tok)
        self.feed = [tok]
        text = self.model.detokenize(self.new)
        if text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            return tok, ""
        piece, self.emitted = text[len(self.emitted):], text
        return tok, piece


async def _batched(server: ServerState, model: Model, ask: Ask) -> AsyncIterator[tuple[int, str]]:
    assert server.batcher is not None
    d, deadline, eos = Decode(model, ask), server.deadline(), set(model.tokenizer.eos_ids)
    for _ in range(ask.max_tokens):
        try:
            item = await asyncio.wait_for(server.batcher.next_logits(model, d.feed, d.cache, d.after),
                                          max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise server.too_slow() from None
        if item[0] in eos:
            return
        yield item


async def tokens(server: ServerState, sess: ClientSession | None, ask: Ask) -> AsyncIterator[tuple[int, str]]:
    """(token id, text) as generated, stopping before the model's stop token: each step batched with
    other clients' (the shared model), or one by one in the pool (a session's own overlay)."""
    model = sess.view.model() if sess is not None else server.served.model
    assert model is not None
    if sess is None and server.batcher is not None:
        async for item in _batched(server, model, ask):
            yield item
        return
    it = model.stream(ask.ids, max_new_tokens=ask.max_tokens, temperature=ask.temperature, top_k=ask.top_k,
                      top_p=ask.top_p, seed=ask.seed)
    deadline = server.deadline()
    eos = set(model.tokenizer.eos_ids)
    while (step := await server.run(_step, it, sess, deadline=deadline)) is not None:
        if step[0] in eos:
            return
        yield step


async def generate(server: ServerState, sess: ClientSession | None, ask: Ask) -> AsyncIterator[str]:
    """Text pieces, cut at a stop string; counts `ask.used` and sets `ask.finish`."""
    scan = StopScan(ask.stop)
    async for _, piece in tokens(server, sess, ask):
        ask.used += 1
        text, stopped = scan.feed(piece)
        if text:
            yield text
        if stopped:
            return
    if ask.used >= ask.max_tokens:
        ask.finish = "length"
    if rest := scan.flush():
        yield rest


def _usage(ask: Ask) -> dict[str, int]:
    return {"prompt_tokens": len(ask.ids), "completion_tokens": ask.used, "total_tokens": len(ask.ids) + ask.used}


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def openai(request: Request, chat: bool) -> Response:
    server = state(request)
    body = await read_json(request)
    ask = await server.run(parse_ask, server, body, chat, 256 if chat else 16)  # tokenizing is work too
    sess = server.session_of(request)
    head = {"id": ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12), "created": int(time.time()),
            "model": server.served.name, "object": "chat.completion" if chat else "text_completion"}

    def choice(text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        if not chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if body.get("stream"):
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            return {"index": 0, "delta": delta, "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}

    if not body.get("stream"):
        text = "".join([p async for p in generate(server, sess, ask)])
        return LarqlJSON({**head, "choices": [choice(text, ask.finish)],
                          "usage": _usage(ask)})

    async def events() -> AsyncIterator[str]:
        chunk = {**head, "object": "chat.completion.chunk"} if chat else head
        if chat:
            yield _sse({**chunk, "choices": [choice(None, None, first=True)]})
        try:
            async for piece in generate(server, sess, ask):
                yield _sse({**chunk, "choices": [choice(piece, None)]})
        except LarqlError as e:  # the status line has gone: the error is the stream's last event
            yield _sse(error_body(e))
            return
        final = {**chunk, "choices": [choice(None, ask.finish)]}
        if (body.get("stream_options") or {}).get("include_usage"):
            final["usage"] = _usage(ask)
        yield _sse(final)
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def completions(request: Request) -> Response:
    return await openai(request, chat=False)


async def chat_completions(request: Request) -> Response:
    return await openai(request, chat=True)


async def stream(ws: WebSocket) -> None:
    """Frames in: a request ({"prompt"} or {"messages"}, plus the sampling fields) or {"type": "cancel"}.
    Frames out: {"type": "token", "id", "text"} ..., then {"type": "done", "finish_reason", "text",
    "usage"}; a bad request gets {"type": "error", "error": {...}} and the socket stays open."""
    server = state(ws)
    await ws.accept()
    cancel = asyncio.Event()
    task: asyncio.Task[None] | None = None

    async def run(body: dict[str, Any], cancel: asyncio.Event) -> None:
        try:
            ask = await server.run(parse_ask, server, body, "messages" in body, 64)
            pieces: list[str] = []
            async for tok, piece in tokens(server, server.session_of(ws), ask):
                if cancel.is_set():
                    ask.finish = "cancelled"
                    break
                pieces.append(piece)
                ask.used += 1
                await ws.send_json({"type": "token", "id": tok, "text": piece})
            else:
                ask.finish = "length" if ask.used >= ask.max_tokens else "stop"
            await ws.send_json({"type": "done", "finish_reason": ask.finish, "text": "".join(pieces),
                                "usage": _usage(ask)})
        except LarqlError as e:
            await error(e)
        except (WebSocketDisconnect, RuntimeError):  # the client left mid-stream
            pass

    async def error(e: Exception) -> None:
        await ws.send_json({"type": "error", **error_body(e)})

    try:
        while True:
            try:
                msg = json.loads(await ws.receive_text())
            except json.JSONDecodeError as e:
                await error(ServeError(f"a frame is not JSON ({e})"))
                continue
            if isinstance(msg, dict) and msg.get("type") == "cancel":
                cancel.set()
            elif not isinstance(msg, dict):
                await error(ServeError("send a JSON object"))
            elif task is not None and not task.done():
                await error(ServeError("a generation is running: wait for its done frame, or cancel it"))
            else:
                cancel = asyncio.Event()
                task = asyncio.create_task(run(msg, cancel))
    except (WebSocketDisconnect, RuntimeError):
        cancel.set()  # the client went away: the generation stops at its next token


def routes() -> list[BaseRoute]:
    return [Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            WebSocketRoute("/v1/stream", stream)]
