"""OpenAI-compatible completions (plain and SSE) and the token WebSocket, on a real server: the tiny
vindex's model for exact agreement with local generation, SmolLM2-135M-Instruct for a real chat."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

import larql
from larql.serve.config import Limits
from tests.serve.conftest import Serve

PROMPT = "hello"


@pytest.fixture(scope="module")
def tiny(serve: Serve, infer_vx: Path) -> Iterator[str]:
    with serve(infer_vx, limits=Limits(max_tokens=40)) as url:
        yield url


@pytest.fixture(scope="module")
def smol(serve: Serve, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from larql.model.load import resolve

    with serve(resolve("smollm2-135m")[1], root=tmp_path_factory.mktemp("smol")) as url:
        yield url


def sse(r: httpx.Response) -> list[Any]:
    """The events of a text/event-stream body, [DONE] as the string."""
    out = []
    for block in r.text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_completion_is_local_greedy_generation(tiny: str, infer_vx: Path) -> None:
    want = larql.load(infer_vx).generate(PROMPT, max_new_tokens=12)
    r = httpx.post(f"{tiny}/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0}, timeout=60)
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == want.text and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len(want.prompt_ids), "completion_tokens": 12,
                             "total_tokens": len(want.prompt_ids) + 12}
    r = httpx.post(f"{tiny}/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                                   "stream": True}, timeout=60)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse(r)
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == want.text and len(events) > 3


def test_stop_strings_cut_the_text(tiny: str) -> None:
    full = httpx.post(f"{tiny}/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
                      ).json()["choices"][0]["text"]
    stop = full[3:5]
    for stream in (False, True):
        r = httpx.post(f"{tiny}/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                                       "stop": [stop], "stream": stream})
        if stream:
            events = sse(r)[:-1]
            text, finish = "".join(e["choices"][0]["text"] for e in events), events[-1]["choices"][0]["finish_reason"]
        else:
            text, finish = r.json()["choices"][0]["text"], r.json()["choices"][0]["finish_reason"]
        assert (text, finish) == (full[:full.find(stop)], "stop")


def test_generation_limits_and_errors(tiny: str, serve: Serve, browse_vx: Path) -> None:
    r = httpx.post(f"{tiny}/v1/completions", json={"prompt": PROMPT, "max_tokens": 41})
    assert r.status_code == 400 and r.json()["error"] == {
        "type": "LimitError", "message": "max_tokens 41 is over this server's limit of 40", "param": "max_tokens",
        "code": None}
    r = httpx.post(f"{tiny}/v1/completions", json={"prompt": PROMPT, "temperature": "hot"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "temperature must be a number, got 'hot'"
    r = httpx.post(f"{tiny}/v1/completions", json={"prompt": "x" * 100, "max_tokens": 8})
    assert r.status_code == 400 and r.json()["error"]["type"] == "ContextLengthError"
    r = httpx.post(f"{tiny}/v1/chat/completions", json={"messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages must be a non-empty list")
    with serve(browse_vx) as url:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT})
        assert r.status_code == 400 and "browse-level" in r.json()["error"]["message"]


def test_chat_uses_the_models_template(smol: str) -> None:
    info = httpx.get(f"{smol}/v1/info").json()
    assert (info["kind"], info["model"], info["chat_template"]) == \
        ("model", "SmolLM2-135M-Instruct.Q4_1.gguf", "gguf (SmolLM2-135M-Instruct.Q4_1.gguf)")
    ask = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0,
           "max_tokens": 24}
    r = httpx.post(f"{smol}/v1/chat/completions", json=ask, timeout=120)
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion", body
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and "Paris" in message["content"]
    assert "<|im_end|>" not in message["content"] and body["choices"][0]["finish_reason"] == "stop"
    events = sse(httpx.post(f"{smol}/v1/chat/completions", json={**ask, "stream": True,
                                                                  "stream_options": {"include_usage": True}},
                            timeout=120))
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"])
    assert text == message["content"]
    assert events[-2]["choices"] == []  # usage comes last, in a chunk of its own as OpenAI sends it
    assert events[-2]["usage"] == body["usage"] and events[-1] == "[DONE]"


def test_websocket_streams_and_cancels(smol: str) -> None:
    ws_url = smol.replace("http://", "ws://") + "/v1/stream"
    with connect(ws_url) as ws:
        ws.send(json.dumps({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}))
        frames = [json.loads(ws.recv(timeout=60))]
        while frames[-1]["type"] == "token":
            frames.append(json.loads(ws.recv(timeout=60)))
        done = frames[-1]
        assert done["type"] == "done" and done["finish_reason"] == "length" and len(frames) == 7
        assert done["text"] == "".join(f["text"] for f in frames[:-1]) and done["usage"]["completion_tokens"] == 6
        ws.send("not json")
        assert json.loads(ws.recv(timeout=10))["error"]["message"].startswith("a frame is not JSON")
        ws.send(json.dumps({"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 400,
                            "temperature": 0}))
        first = json.loads(ws.recv(timeout=60))
        assert first["type"] == "token"
        ws.send(json.dumps({"type": "cancel"}))
        frames = [first]
        while frames[-1]["type"] == "token":
            frames.append(json.loads(ws.recv(timeout=60)))
        assert frames[-1]["finish_reason"] == "cancelled" and frames[-1]["usage"]["completion_tokens"] < 400


def test_websocket_frames_carry_larqls_fields(tiny: str, infer_vx: Path) -> None:
    """Each token frame's `index` counts from 0; the done frame's `tokens` is how many token frames
    came and `latency_ms` the request's wall time, as LARQL's frames have them (ours beside them)."""
    want = larql.load(infer_vx).generate(PROMPT, max_new_tokens=5)
    with connect(tiny.replace("http://", "ws://") + "/v1/stream") as ws:
        for _ in range(2):  # the fields start again for each request on one socket
            t0 = time.perf_counter()
            ws.send(json.dumps({"prompt": PROMPT, "max_tokens": 5, "temperature": 0}))
            frames = [json.loads(ws.recv(timeout=60))]
            while frames[-1]["type"] == "token":
                frames.append(json.loads(ws.recv(timeout=60)))
            wall_ms = (time.perf_counter() - t0) * 1000
            *toks, done = frames
            assert [f["index"] for f in toks] == [0, 1, 2, 3, 4]
            assert [f["id"] for f in toks] == list(want.ids) and done["text"] == want.text
            assert done["tokens"] == 5 == done["usage"]["completion_tokens"]
            assert isinstance(done["latency_ms"], float) and 0 < done["latency_ms"] <= wall_ms


def test_chat_falls_back_to_a_built_in_template(tiny: str, infer_vx: Path, gemma: larql.Model) -> None:
    from larql.model.chat_template import find_template

    assert httpx.get(f"{tiny}/v1/info").json()["chat_template"] == "built-in plain transcript"
    want = larql.load(infer_vx).generate("User: hi\nAssistant:", max_new_tokens=5).text
    r = httpx.post(f"{tiny}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 5, "temperature": 0})
    assert r.json()["choices"][0]["message"]["content"] == want
    t = find_template(gemma, Path(gemma.source))  # this GGUF carries no template: Gemma's turn markers
    ids = t.render(gemma, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}])
    assert t.origin == "built-in gemma" and ids.count(gemma.tokenizer.bos_id) == 1
    assert gemma.detokenize(ids) == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
                                     "Hello<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n"
                                     "<start_of_turn>model\n")
