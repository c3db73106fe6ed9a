"""A second OpenAI client against `larql serve`: LangChain's `ChatOpenAI` and `OpenAIEmbeddings`
(the `langchain-openai` package, not a larql dependency) beside the official `openai` client, on a
real server over loopback serving the bundled SmolLM2-135M.

    pip install langchain-openai
    python benchmarks/check_openai_clients.py [--model smollm2-135m] [--name openai-clients]

Checks that LangChain's greedy chat reply, its streamed reply, its per-token log-probabilities and
its embeddings equal what the official client gets from the same server; writes
benchmarks/results/NAME.json (each check, its values, the packages' versions) and exits 1 if one
differs. The official client's own checks run in the tests (tests/serve/test_openai_client.py).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from typing import Any

import numpy as np
import openai
from results_file import save_results

from larql.cli.benchmark import machine
from larql.serve.config import ServeConfig
from larql.serve.server import ServerThread
from larql.serve.sessions import open_served

QUESTION = "What is the capital of France?"
TEXTS = ["The capital of France is Paris.", "Bonjour"]


def official(url: str, model: str) -> dict[str, Any]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    messages: Any = [{"role": "user", "content": QUESTION}]
    r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=16,
                                       logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    emb = client.embeddings.create(model=model, input=TEXTS)
    return {"reply": r.choices[0].message.content, "logprobs": [t.logprob for t in content or []],
            "embeddings": [d.embedding for d in emb.data]}


def langchain(url: str, model: str) -> dict[str, Any]:
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    chat = ChatOpenAI(base_url=url + "/v1", api_key="unused", model=model, temperature=0,  # type: ignore[arg-type]
                      max_tokens=16, max_retries=0, logprobs=True, top_logprobs=2)  # type: ignore[call-arg]
    reply = chat.invoke(QUESTION)
    streamed = "".join(str(chunk.content) for chunk in chat.stream(QUESTION))
    # no tiktoken: its encodings are downloaded at first use, and the server counts tokens itself
    embed = OpenAIEmbeddings(base_url=url + "/v1", api_key="unused", model=model,  # type: ignore[arg-type]
                             check_embedding_ctx_length=False, max_retries=0)
    tokens = (reply.response_metadata.get("logprobs") or {}).get("content") or []
    return {"reply": reply.content, "streamed": streamed, "logprobs": [t["logprob"] for t in tokens],
            "embeddings": embed.embed_documents(TEXTS)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--name", default="openai-clients")
    args = parser.parse_args()
    with ServerThread(open_served(args.model), ServeConfig()) as url:
        want, got = official(url, args.model), langchain(url, args.model)
    checks = {
        "chat reply": got["reply"] == want["reply"],
        "streamed reply": got["streamed"] == want["reply"],
        "logprobs": len(got["logprobs"]) > 0 and np.allclose(got["logprobs"], want["logprobs"], atol=1e-6),
        "embeddings": np.allclose(np.asarray(got["embeddings"]), np.asarray(want["embeddings"]), atol=1e-6),
    }
    versions = {p: importlib.metadata.version(p) for p in ("openai", "langchain-openai", "langchain-core")}
    out = {"machine": machine(), "model": args.model, "versions": versions, "checks": checks,
           "official_reply": want["reply"], "langchain_reply": got["reply"], "langchain_streamed": got["streamed"],
           "tokens_with_logprobs": len(got["logprobs"])}
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(f"wrote {save_results(args.name, out)}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
