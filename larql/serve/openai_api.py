"""The OpenAI-compatible routes, as the official `openai` client and its look-alikes call them.

    GET  /v1/models, /v1/models/{id}   the served model (its name is the one model id)
    POST /v1/completions               legacy completions: logprobs (k), echo, n, stream
    POST /v1/chat/completions          chat: logprobs + top_logprobs, n, stream
    POST /v1/embeddings                one vector per input (see `embed` for the pooling)

Log-probabilities are exact: the log-softmax of the raw logits of the very forward pass that chose
the token. With a temperature or top_p they are still the model's distribution, not the sampling
one. The `model` field of a request is not checked: the served model answers whatever it names.
Errors have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with larql's error
class as the `type`.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from larql.errors import LarqlError, ServeError
from larql.serve.embeddings import embeddings
from larql.serve.generation import Ask, Token, generate, parse_ask, scored, usage
from larql.serve.http import LarqlJSON, ServerState, error_body, read_json, state
from larql.serve.sessions import ClientSession

if TYPE_CHECKING:
    from larql.model.model import Model


T = TypeVar("T")


async def merged(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T | None]]:
    """(index, item) from several streams as the items come, and (index, None) when one ends: the
    `n` choices of one request generate at once (so their steps share batched passes)."""
    queue: asyncio.Queue[tuple[int, T | None, BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((i, item, None))
            await queue.put((i, None, None))
        except Exception as e:
            await queue.put((i, None, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(streams)
        while running:
            i, item, err = await queue.get()
            if err is not None:
                raise err
            running -= item is None
            yield i, item
    finally:
        for t in tasks:  # the client went away, or a choice failed: stop the others too
            t.cancel()


def _card(server: ServerState) -> dict[str, Any]:
    return {"id": server.served.name, "object": "model", "created": int(server.started), "owned_by": "larql"}


async def models(request: Request) -> Response:
    return LarqlJSON({"object": "list", "data": [_card(state(request))]})


async def model(request: Request) -> Response:
    server, wanted = state(request), request.path_params["model"]
    if wanted != server.served.name:
        raise ServeError(f"the model {wanted!r} is not served here; this server serves {server.served.name!r}",
                         status=404, param="model", code="model_not_found")
    return LarqlJSON(_card(server))


def prompt_scores(model: Model, ids: list[int], top: int, sess: ClientSession | None) -> list[Token]:
    """The prompt's tokens scored by one forward pass over it: each token's log-probability after
    the ones before it (None for the first, which nothing predicts). A token's `text` is what its
    bytes add to the decoded prompt (a leading BOS adds nothing), decoded incrementally: linear in
    the prompt's length."""
    if sess is not None:
        with sess.lock:
            logits = model.forward(ids)  # (T, vocab)
    else:
        logits = model.forward(ids)
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out = []
    for i, tid in enumerate(ids):
        text = "" if i == 0 and tid == model.tokenizer.bos_id else utf8.decode(model.tokenizer.token_bytes(tid))
        out.append(Token(tid, text, *scored(tid, logits[i - 1], top)) if i else Token(tid, text))
    return out


def chat_logprobs(model: Model, toks: list[Token]) -> dict[str, Any]:
    """`choices[].logprobs` of a chat completion: `content[]` of {token, logprob, bytes, top_logprobs}."""
    def entry(tid: int, lp: float | None) -> dict[str, Any]:
        return {"token": model.tokenizer.token_text(tid), "logprob": lp,
                "bytes": list(model.tokenizer.token_bytes(tid))}

    return {"content": [{**entry(t.id, t.logprob), "top_logprobs": [entry(i, lp) for i, lp in t.top]}
                        for t in toks], "refusal": None}


def legacy_logprobs(model: Model, toks: list[Token], offset: int) -> tuple[dict[str, Any], int]:
    """`choices[].logprobs` of a legacy completion (tokens, token_logprobs, top_logprobs, text_offset),
    the first token at character `offset` of the choice's text; and the offset after the last."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t in toks:
        out["tokens"].append(model.tokenizer.token_text(t.id))
        out["token_logprobs"].append(t.logprob)
        out["top_logprobs"].append(None if t.logprob is None else
                                   {model.tokenizer.token_text(i): lp for i, lp in t.top})
        out["text_offset"].append(offset)
        offset += len(t.text)
    return out, offset


def _joined(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: a[k] + b[k] for k in a}


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


@dataclass
class Reply:
    """One completion request under way: its choices' asks (seed + i each) and what every choice
    shares (the model that answers, the echoed prompt and its scores, the response's head)."""

    server: ServerState
    sess: ClientSession | None
    llm: Model
    ask: Ask
    chat: bool
    head: dict[str, Any]
    scores: list[Token]  # the echoed prompt's tokens, scored (empty without echo + logprobs)
    asks: list[Ask] = field(init=False)

    def __post_init__(self) -> None:
        self.asks = [self.ask.choice(i) for i in range(self.ask.n)]
        self.lp, self.echoed = self.ask.logprobs is not None, self.ask.prompt if self.ask.echo else ""

    def legacy(self, toks: list[Token], offset: int) -> tuple[dict[str, Any] | None, int]:
        return legacy_logprobs(self.llm, toks, offset) if self.lp else (None, offset)

    def usage(self) -> dict[str, int]:
        return usage(self.ask, sum(a.used for a in self.asks))

    async def _collect(self, ask: Ask) -> tuple[str, list[Token]]:
        text, toks = [], []
        async for piece, got in generate(self.server, self.sess, ask):
            text.append(piece)
            toks.extend(got)
        return "".join(text), toks

    async def whole(self) -> dict[str, Any]:
        """The response of a request without "stream": every choice generated at once."""
        results = await asyncio.gather(*(self._collect(a) for a in self.asks))
        choices = []
        for i, (a, (text, toks)) in enumerate(zip(self.asks, results)):
            if self.chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": text},
                                "logprobs": chat_logprobs(self.llm, toks) if self.lp else None,
                                "finish_reason": a.finish})
                continue
            logprobs, _ = self.legacy(toks, len(self.echoed))
            if logprobs is not None and self.ask.echo:
                logprobs = _joined(legacy_logprobs(self.llm, self.scores, 0)[0], logprobs)
            choices.append({"index": i, "text": self.echoed + text, "logprobs": logprobs, "finish_reason": a.finish})
        return {**self.head, "choices": choices, "usage": self.usage()}

    async def events(self, include_usage: bool) -> AsyncIterator[str]:
        """The server-sent events of a "stream" request: the choices' chunks as they come."""
        chunk = {**self.head, "object": "chat.completion.chunk"} if self.chat else self.head
        offsets = [0] * self.ask.n  # a legacy choice's text so far, for text_offset

        def event(i: int, text: str | None, toks: list[Token], finish: str | None = None) -> str:
            if self.chat:
                logprobs = chat_logprobs(self.llm, toks) if self.lp and toks else None
                choice = {"index": i, "delta": {"content": text} if text else {}, "logprobs": logprobs}
            else:
                legacy, offsets[i] = self.legacy(toks, offsets[i])
                choice = {"index": i, "text": text or "", "logprobs": legacy}
            return _sse({**chunk, "choices": [{**choice, "finish_reason": finish}]})

        for i in range(self.ask.n):
            if self.chat:
                yield _sse({**chunk, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                  "logprobs": None, "finish_reason": None}]})
            elif self.ask.echo:
                yield event(i, self.echoed, self.scores)
                offsets[i] = len(self.echoed)
        try:
            async for i, item in merged([generate(self.server, self.sess, a) for a in self.asks]):
                if item is None:
                    yield event(i, None, [], self.asks[i].finish)
                elif item[0] or (self.lp and item[1]):
                    yield event(i, *item)
        except LarqlError as e:  # the status line has gone: the error is the stream's last event
            yield _sse(error_body(e, openai=True))
            return
        if include_usage:
            yield _sse({**chunk, "choices": [], "usage": self.usage()})
        yield "data: [DONE]\n\n"


async def openai(request: Request, chat: bool) -> Response:
    server = state(request)
    body = await read_json(request)
    ask = await server.run(parse_ask, server, body, chat, 256 if chat else 16)  # tokenizing is work too
    sess = server.session_of(request)
    llm = sess.view.model() if sess is not None else server.served.model
    assert llm is not None
    head = {"id": ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12), "created": int(time.time()),
            "model": server.served.name, "object": "chat.completion" if chat else "text_completion"}
    scores: list[Token] = []
    if ask.echo and ask.logprobs is not None:
        scores = await server.run(prompt_scores, llm, ask.ids, ask.logprobs, sess, deadline=server.deadline())
    reply = Reply(server, sess, llm, ask, chat, head, scores)
    if not body.get("stream"):
        return LarqlJSON(await reply.whole())
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ServeError('stream_options must be an object, e.g. {"include_usage": true}', param="stream_options")
    events = reply.events(bool(options.get("include_usage")))
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def completions(request: Request) -> Response:
    return await openai(request, chat=False)


async def chat_completions(request: Request) -> Response:
    return await openai(request, chat=True)


def routes() -> list[BaseRoute]:
    return [Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model:path}", model, methods=["GET"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"])]

