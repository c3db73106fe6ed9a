"""Generation for the OpenAI-compatible routes (openai_api.py) and the token WebSocket /v1/stream:
a request checked into an `Ask`, then its tokens, one step at a time.

Generation runs the served model; a client with a session runs it with its own overlay, so its
edits show in its completions. Each token is one step in the worker pool (the forward pass holds
no lock on the event loop); a stream stops at the model's stop token, a "stop" string, max_tokens,
the client going away, or a {"type": "cancel"} frame on the WebSocket.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from larql.errors import LarqlError, LimitError, ServeError
from larql.model.chat_template import ChatTemplate, find_template
from larql.model.generate import SamplingParams, log_softmax, sample
from larql.serve.http import ServerState, error_body, state
from larql.serve.sessions import ClientSession

if TYPE_CHECKING:
    from larql.model.model import Model


@dataclass
class Ask:
    """One generation request, checked: the prompt's ids and the sampling parameters.

    `logprobs` is None when the client asked for no log-probabilities, else how many of the most
    likely alternatives each token lists (0: the chosen token's log-probability alone)."""

    ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1  # choices to generate, each its own sample
    logprobs: int | None = None
    echo: bool = False  # a completion's text (and log-probs) begin with the prompt's
    prompt: str = ""  # a completion's prompt as sent
    used: int = 0  # tokens generated so far
    finish: str = "stop"  # stop | length | cancelled

    def choice(self, index: int) -> Ask:
        """The request for choice `index`: a fresh count, and seed + index when a seed was given
        (so the choices differ, and each is the one a request with that seed and n=1 gets)."""
        return replace(self, seed=None if self.seed is None else self.seed + index, used=0, finish="stop")


@dataclass
class Token:
    """One generated token: its id, the text it newly makes decodable, and (when asked) its
    log-probability and the `top` most likely (id, log-probability) pairs at its position."""

    id: int
    text: str
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


MAX_N, MAX_TOP_LOGPROBS = 16, 20


def _number(body: dict[str, Any], key: str, default: Any, kind: type, low: float, high: float) -> Any:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise ServeError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {v!r}", param=key)
    if not low <= v <= high:
        raise ServeError(f"{key} must be between {low:g} and {high:g}, got {v}", param=key)
    return kind(v)


def template(server: ServerState) -> ChatTemplate:
    """The served model's chat template, found once."""
    served = server.served
    if server.chat is None:
        assert served.model is not None
        server.chat = find_template(served.model, served.path, served.base.index if served.base else None)
    return server.chat


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """The `logprobs` a request asks for: chat's `logprobs: true` + `top_logprobs: k`, or the
    legacy completions' `logprobs: k`."""
    if not chat:  # false is what some clients send for "none"
        return None if body.get("logprobs") is False else _number(body, "logprobs", None, int, 0, MAX_TOP_LOGPROBS)
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise ServeError(f"logprobs must be true or false, got {wanted!r}", param="logprobs")
    top = _number(body, "top_logprobs", None, int, 0, MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise ServeError("top_logprobs needs logprobs: true", param="top_logprobs")
    return (top or 0) if wanted else None


def parse_ask(server: ServerState, body: dict[str, Any], chat: bool, default_tokens: int) -> Ask:
    """Check an OpenAI-style body and tokenize its prompt (raises ServeError / LimitError)."""
    model = server.served.model
    if model is None:
        raise ServeError("this vindex is browse-level: generation needs model weights (extract it WITH INFERENCE)")
    echo = body.get("echo") or False
    if not isinstance(echo, bool) or (echo and chat):
        raise ServeError("echo must be true or false, and is for /v1/completions only", param="echo")
    limit = server.config.limits.max_tokens
    default_tokens = min(default_tokens, limit)  # only a max_tokens the client asked for can be over the limit
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", default_tokens))
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > limit:
        raise LimitError(f"max_tokens {max_tokens} is over this server's limit of {limit}", status=400,
                         param="max_tokens")
    # with echo, max_tokens 0 scores the prompt alone
    ask = Ask([], _number({"max_tokens": max_tokens}, "max_tokens", default_tokens, int, 0 if echo else 1, limit),
              _number(body, "temperature", 1.0, float, 0.0, 2.0), _number(body, "top_p", 1.0, float, 1e-9, 1.0),
              _number(body, "top_k", 0, int, 0, 1 << 20), _number(body, "seed", None, int, 0, 2**63 - 1 - MAX_N),
              n=_number(body, "n", 1, int, 1, MAX_N), logprobs=_logprobs(body, chat), echo=echo)
    stop = body.get("stop") or []
    ask.stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(ask.stop, list) or len(ask.stop) > 4 or not all(isinstance(s, str) and s for s in ask.stop):
        raise ServeError("stop must be a string or a list of at most 4 non-empty strings", param="stop")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise ServeError('messages must be a non-empty list of {"role": ..., "content": "text"}', param="messages")
        ask.ids = template(server).render(model, messages)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ServeError("prompt must be a string (one prompt per request)", param="prompt")
        ask.ids, ask.prompt = model.tokenize(prompt), prompt
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


def scored(tok: int, logits: NDArray[np.float32], top: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of `tok` and the `top` most likely (id, log-probability) pairs: the
    log-softmax of the raw logits, whatever temperature or top-p then chose among them."""
    lp = log_softmax(logits, np.float64)
    best = np.argpartition(-lp, top - 1)[:top] if 0 < top < len(lp) else np.arange(len(lp) if top else 0)
    best = best[np.argsort(-lp[best], kind="stable")]
    return float(lp[tok]), [(int(i), float(lp[i])) for i in best]


class Decode:
    """One generation stepped by the caller: what `Model.stream` keeps between tokens."""

    def __init__(self, model: Model, ask: Ask) -> None:
        self.model, self.feed, self.new, self.emitted = model, list(ask.ids), list[int](), ""
        self.params = SamplingParams(ask.temperature, ask.top_k, ask.top_p, ask.seed)
        self.rng = np.random.default_rng(ask.seed)
        self.cache = model.new_cache(len(ask.ids) + ask.max_tokens)
        self.logprobs = ask.logprobs

    def after(self, logits: NDArray[np.float32]) -> Token:
        """The next token from the logits after `feed` (in the thread that ran the pass)."""
        tok = sample(logits, self.params, self.rng)
        out = Token(tok, "")
        if self.logprobs is not None:
            out.logprob, out.top = scored(tok, logits, self.logprobs)
        self.new.append(tok)
        self.feed = [tok]
        text = self.model.detokenize(self.new)
        if not text.endswith("\ufffd"):  # else wait for the rest of a multi-byte character
            out.text, self.emitted = text[len(self.emitted):], text
        return out

    def step(self, sess: ClientSession | None) -> Token:
        """The next token, its pass run here (a pool thread), under the session's lock if any."""
        if sess is None:
            return self.after(self.model.next_logits(self.feed, self.cache))
        with sess.lock:  # the session's overlay may not change under a forward pass
            return self.after(self.model.next_logits(self.feed, self.cache))


def _step(it: Iterator[tuple[int, str]], sess: ClientSession | None) -> Token | None:
    if sess is None:
        step = next(it, None)
    else:
        with sess.lock:  # the session's overlay may not change under a forward pass
            step = next(it, None)
    return None if step is None else Token(*step)


async def _batched(server: ServerState, model: Model, ask: Ask) -> AsyncIterator[Token]:
    assert server.batcher is not None
    d, deadline, eos = Decode(model, ask), server.deadline(), set(model.tokenizer.eos_ids)
    for _ in range(ask.max_tokens):
        try:
            tok = await asyncio.wait_for(server.batcher.next_logits(model, d.feed, d.cache, d.after),
                                         max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise server.too_slow() from None
        if tok.id in eos:
            return
        yield tok


async def tokens(server: ServerState, sess: ClientSession | None, ask: Ask) -> AsyncIterator[Token]:
    """Tokens as generated, stopping before the model's stop token: each step batched with other
    clients' (the shared model), or one by one in the pool (a session's own overlay)."""
    model = sess.view.model() if sess is not None else server.served.model
    assert model is not None
    if sess is None and server.batcher is not None:
        async for item in _batched(server, model, ask):
            yield item
        return
    deadline, eos = server.deadline(), set(model.tokenizer.eos_ids)
    if ask.logprobs is not None:  # the logits of every step are needed: step them here
        d = Decode(model, ask)
        for _ in range(ask.max_tokens):
            tok = await server.run(d.step, sess, deadline=deadline)
            if tok.id in eos:
                return
            yield tok
        return
    it = model.stream(ask.ids, max_new_tokens=ask.max_tokens, temperature=ask.temperature, top_k=ask.top_k,
                      top_p=ask.top_p, seed=ask.seed)
    while (step := await server.run(_step, it, sess, deadline=deadline)) is not None:
        if step.id in eos:
            return
        yield step


async def generate(server: ServerState, sess: ClientSession | None, ask: Ask) -> AsyncIterator[tuple[str, list[Token]]]:
    """(text, the tokens read since the last piece) pieces, the text cut at a stop string; counts
    `ask.used` and sets `ask.finish`. A piece's text may be empty when only its tokens are news.
    The text ends as the tokens decode: a last multi-byte character left unfinished comes as U+FFFD."""
    scan, pending, ids, sent = StopScan(ask.stop), list[Token](), list[int](), 0
    async for tok in tokens(server, sess, ask):
        ask.used += 1
        pending.append(tok)
        ids.append(tok.id)
        sent += len(tok.text)
        text, stopped = scan.feed(tok.text)
        if text or stopped:
            yield text, pending
            pending = []
        if stopped:
            return
    if ask.used >= ask.max_tokens:
        ask.finish = "length"
    model = sess.view.model() if sess is not None else server.served.model
    assert model is not None
    tail = model.detokenize(ids)[sent:] if ids else ""  # bytes held back for a character never finished
    text, stopped = scan.feed(tail)
    if stopped:
        ask.finish = "stop"
    if (rest := text + ("" if stopped else scan.flush())) or pending:
        yield rest, pending


def usage(ask: Ask, completion_tokens: int | None = None) -> dict[str, int]:
    used = ask.used if completion_tokens is None else completion_tokens
    return {"prompt_tokens": len(ask.ids), "completion_tokens": used, "total_tokens": len(ask.ids) + used}


async def stream(ws: WebSocket) -> None:
    """Frames in: a request ({"prompt"} or {"messages"}, plus the sampling fields) or {"type": "cancel"}.
    Frames out: {"type": "token", "id", "text", "index"} ..., then {"type": "done", "finish_reason", "text",
    "usage", "tokens", "latency_ms"}; a bad request gets {"type": "error", "error": {...}} and the socket
    stays open. `index` (the token's 0-based place in the reply), `tokens` (how many were sent) and
    `latency_ms` (from the request frame to the done frame) are LARQL's fields, carried beside ours."""
    server = state(ws)
    await ws.accept()
    cancel = asyncio.Event()
    task: asyncio.Task[None] | None = None

    async def run(body: dict[str, Any], cancel: asyncio.Event) -> None:
        t0 = time.perf_counter()
        try:
            ask = await server.run(parse_ask, server, body, "messages" in body, 64)
            pieces: list[str] = []
            async for tok in tokens(server, server.session_of(ws), ask):
                if cancel.is_set():
                    ask.finish = "cancelled"
                    break
                await ws.send_json({"type": "token", "id": tok.id, "text": tok.text, "index": len(pieces)})
                pieces.append(tok.text)
                ask.used += 1
            else:
                ask.finish = "length" if ask.used >= ask.max_tokens else "stop"
            await ws.send_json({"type": "done", "finish_reason": ask.finish, "text": "".join(pieces),
                                "usage": usage(ask), "tokens": len(pieces),
                                "latency_ms": round((time.perf_counter() - t0) * 1000, 3)})
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
    return [WebSocketRoute("/v1/stream", stream)]
