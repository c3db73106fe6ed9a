"""The official `openai` client against a real loopback server of the tiny vindex: models, chat and
completions with log-probabilities (streamed and not), echo, n > 1, embeddings and errors.

Every expected number is computed here from the Python API (`larql.load(...).forward`,
`run_with_cache`) with an independent log-softmax, never taken from the server."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

import larql
from larql.serve.config import Limits
from tests.serve.conftest import Serve
from tests.synthetic import BYTE_SYMBOLS

CHAT_PROMPT = "User: hi\nAssistant:"  # the built-in transcript template's rendering of one "hi"
MISSING = [b for b in range(256) if chr(b) not in BYTE_SYMBOLS]  # bytes the GPT-2 alphabet moves past 255


@pytest.fixture(scope="module", params=[16, 0], ids=["batched", "one-by-one"])
def url(request: pytest.FixtureRequest, serve: Serve, infer_vx: Path) -> Iterator[str]:
    with serve(infer_vx, limits=Limits(max_tokens=40), batch=request.param) as u:
        yield u


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(infer_vx: Path) -> larql.Model:
    return larql.load(infer_vx)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def token_bytes(tid: int) -> bytes:
    code = ord(BYTE_SYMBOLS[tid])
    return bytes([MISSING[code - 256] if code >= 256 else code])


def scores(model: larql.Model, ids: list[int], start: int) -> list[np.ndarray]:
    """The log-softmax of the logits before each of ids[start:], from one forward pass."""
    logits = model.forward(ids)
    return [log_softmax(logits[i - 1]) for i in range(start, len(ids))]


def test_models_list_and_retrieve(client: openai.OpenAI, url: str) -> None:
    name = httpx.get(url + "/v1/info").json()["model"]
    listed = client.models.list()
    assert [m.id for m in listed.data] == [name] and listed.data[0].owned_by == "larql"
    assert client.models.retrieve(name).id == name
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    assert e.value.code == "model_not_found" and e.value.param == "model"
    assert e.value.body == {"message": f"the model 'gpt-4' is not served here; this server serves {name!r}",
                            "type": "ServeError", "param": "model", "code": "model_not_found"}


@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_chat_logprobs_are_the_models(client: openai.OpenAI, model: larql.Model, temperature: float) -> None:
    """The chosen token's log-probability and the top 3, at every step, equal the log-softmax of the
    Python API's logits, greedy and sampled (the sampled tokens are those `generate` draws with the seed)."""
    want = model.generate(CHAT_PROMPT, max_new_tokens=6, temperature=temperature, seed=11, stop_at_eos=False)
    ask: dict[str, Any] = dict(model="anything", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                               temperature=temperature, seed=11, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**ask)
    content = r.choices[0].logprobs.content
    eos = model.tokenizer.eos_ids
    n = next((i for i, t in enumerate(want.ids) if t in eos), len(want.ids))  # the reply stops before EOS
    assert r.choices[0].message.content == model.detokenize(want.ids[:n]) and len(content) == n
    assert r.usage.completion_tokens == n and r.usage.prompt_tokens == len(want.prompt_ids)
    for got, tid, lp in zip(content, want.ids, scores(model, want.prompt_ids + want.ids, len(want.prompt_ids))):
        assert got.bytes == list(token_bytes(tid)) and got.token == model.tokenizer.token_text(tid)
        assert got.logprob == pytest.approx(lp[tid], abs=2e-4)
        top = np.argsort(-lp, kind="stable")[:3]
        assert [t.bytes for t in got.top_logprobs] == [list(token_bytes(int(i))) for i in top]
        assert [t.logprob for t in got.top_logprobs] == pytest.approx(lp[top], abs=2e-4)
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [c for ch in chunks for c in (ch.choices[0].logprobs.content if ch.choices[0].logprobs else [])]
    assert [(c.token, c.bytes) for c in streamed] == [(c.token, c.bytes) for c in content]
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in content], abs=1e-5)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == r.choices[0].message.content


def test_completion_logprobs_with_echo(client: openai.OpenAI, model: larql.Model) -> None:
    prompt = "hello"
    want = model.generate(prompt, max_new_tokens=5, stop_at_eos=False)
    assert not set(want.ids) & set(model.tokenizer.eos_ids)  # else the text stops short of 5 tokens
    r = client.completions.create(model="m", prompt=prompt, max_tokens=5, temperature=0, logprobs=2, echo=True)
    c = r.choices[0]
    ids = want.prompt_ids + want.ids
    assert c.text == prompt + want.text and c.finish_reason == "length"
    assert c.logprobs.tokens == [model.tokenizer.token_text(t) for t in ids]
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    lps = scores(model, ids, 1)
    assert c.logprobs.token_logprobs[1:] == pytest.approx([lp[t] for lp, t in zip(lps, ids[1:])], abs=2e-4)
    for top, lp in zip(c.logprobs.top_logprobs[1:], lps):
        best = np.argsort(-lp, kind="stable")[:2]
        assert top == pytest.approx({model.tokenizer.token_text(int(i)): lp[i] for i in best}, abs=2e-4)
    offsets = [len(model.detokenize(ids[:i])) for i in range(len(ids))]
    assert c.logprobs.text_offset == offsets and r.usage.completion_tokens == 5
    chunks = list(client.completions.create(model="m", prompt=prompt, max_tokens=5, temperature=0, logprobs=2,
                                            echo=True, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == c.text
    streamed = [x for ch in chunks if ch.choices[0].logprobs for x in ch.choices[0].logprobs.text_offset]
    assert streamed == offsets
    scored = client.completions.create(model="m", prompt=prompt, max_tokens=0, logprobs=0, echo=True)
    assert scored.choices[0].text == prompt and scored.choices[0].logprobs.token_logprobs == \
        pytest.approx(c.logprobs.token_logprobs[:len(want.prompt_ids)], abs=1e-5)


def test_n_choices_each_with_its_seed(client: openai.OpenAI, model: larql.Model) -> None:
    wants = [model.generate("hello", max_new_tokens=8, temperature=2.0, seed=s) for s in (5, 6, 7)]
    r = client.completions.create(model="m", prompt="hello", max_tokens=8, temperature=2.0, seed=5, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [w.text for w in wants] and len({w.text for w in wants}) > 1
    assert r.usage.completion_tokens == sum(len(w.ids) - (w.finish_reason == "stop") for w in wants)
    chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=2,
                                                 max_tokens=8, temperature=2.0, seed=5, stream=True))
    texts = ["".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices[0].index == i)
             for i in (0, 1)]
    assert texts == [client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=8, temperature=2.0, seed=s).choices[0].message.content
                     for s in (5, 6)]
    finishes = [ch.choices[0].index for ch in chunks if ch.choices[0].finish_reason]
    assert sorted(finishes) == [0, 1]


def test_embeddings_pool_the_final_norm(client: openai.OpenAI, model: larql.Model) -> None:
    texts = ["hello", "the capital of France"]
    want = []
    for t in texts:
        _, acts = model.run_with_cache(model.tokenize(t), names=["hook_final_norm"])
        want.append(acts["hook_final_norm"].astype(np.float64).mean(axis=0))
    r = client.embeddings.create(model="m", input=texts)  # the client asks for base64 and decodes it
    assert [d.index for d in r.data] == [0, 1] and len(r.data[0].embedding) == model.config.hidden
    for d, w in zip(r.data, want):
        np.testing.assert_allclose(d.embedding, w, rtol=1e-5, atol=1e-6)
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(model.tokenize(t)) for t in texts)
    floats = client.embeddings.create(model="m", input="hello", encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, want[0], rtol=1e-5, atol=1e-6)
    ids = client.embeddings.create(model="m", input=model.tokenize("hello"), encoding_format="base64")
    raw = ids.data[0].embedding
    vec = np.frombuffer(base64.b64decode(raw), "<f4") if isinstance(raw, str) else np.asarray(raw)
    np.testing.assert_allclose(vec, want[0], rtol=1e-5, atol=1e-6)


def test_errors_in_openais_shape(client: openai.OpenAI, url: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="hi", n=17)
    assert e.value.param == "n" and e.value.body["message"] == "n must be between 1 and 16, got 17"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], top_logprobs=2)
    assert e.value.param == "top_logprobs" and e.value.body["message"] == "top_logprobs needs logprobs: true"
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="m", input=[[1, 2], []])
    assert e.value.param == "input" and e.value.body["type"] == "ServeError"
    r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "stream": True, "stream_options": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"
    r = httpx.post(url + "/v1/embeddings", json={"input": "hi", "encoding_format": "int8"})
    assert r.status_code == 400 and r.json() == {"error": {
        "type": "ServeError", "message": "encoding_format must be \"float\" or \"base64\", got 'int8'",
        "param": "encoding_format", "code": None}}


def test_a_sessions_edits_show_in_its_logprobs_and_embeddings(serve: Serve, infer_vx: Path,
                                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    """A client with a session (its own overlay) is answered by its edited model, one step at a time
    under the session's lock: the numbers are those of the same edit made locally."""
    from larql.lql.executor import execute
    from larql.lql.session import Session

    edit = "DELETE FROM EDGES WHERE layer = 2"
    local = Session(vindex=larql.edit_vindex(infer_vx))
    execute(edit, local)
    edited, plain = local.vindex.model(), larql.load(infer_vx)
    ids = edited.tokenize(CHAT_PROMPT)
    want = edited.generate(ids, max_new_tokens=4, stop_at_eos=False)
    lps = scores(edited, ids + want.ids, len(ids))
    assert not np.allclose(lps[0], scores(plain, ids + want.ids, len(ids))[0], atol=1e-3)  # the edit shows
    with serve(infer_vx, root=tmp_path_factory.mktemp("sess"), allow_edits=True) as u:
        r = httpx.post(u + "/v1/lql", json={"query": edit}, timeout=60)
        assert r.status_code == 200, r.text
        client = openai.OpenAI(base_url=u + "/v1", api_key="x", max_retries=0, timeout=120,
                               default_headers={"X-Larql-Session": r.headers["x-larql-session"]})
        got = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                             temperature=0, logprobs=True)
        n = len(got.choices[0].logprobs.content)
        assert [c.logprob for c in got.choices[0].logprobs.content] == pytest.approx(
            [lp[t] for lp, t in zip(lps[:n], want.ids)], abs=2e-4) and n >= 1
        _, acts = edited.run_with_cache(edited.tokenize("hello"), names=["hook_final_norm"])
        vec = client.embeddings.create(model="m", input="hello").data[0].embedding
        np.testing.assert_allclose(vec, acts["hook_final_norm"].astype(np.float64).mean(axis=0), rtol=1e-5, atol=1e-6)
