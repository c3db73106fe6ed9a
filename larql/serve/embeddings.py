"""POST /v1/embeddings: one vector per input, in OpenAI's shape.

The pooling: the mean over every position of the input (a BOS the tokenizer adds included) of the
final normed residual, the hook point `hook_final_norm` (what the lm_head reads), as float32 of the
model's hidden width. It is not scaled to unit length; normalize it for cosine similarity.

    {"input": "text" | ["text", ...] | [ids...] | [[ids...], ...], "encoding_format": "float" | "base64"}
 -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}

"base64" is the float32 little-endian bytes of the vector (what the `openai` client asks for and
decodes by default).
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from starlette.requests import Request
from starlette.responses import Response

from larql.errors import LimitError, ServeError
from larql.serve.http import LarqlJSON, ServerState, read_json, state
from larql.serve.sessions import ClientSession

if TYPE_CHECKING:
    from larql.model.model import Model

POOLED_HOOK = "hook_final_norm"
MAX_INPUTS = 256


def embed(model: Model, ids: list[int]) -> NDArray[np.float32]:
    """The embedding of one tokenized input: the mean of `hook_final_norm` over its positions."""
    _, acts = model.run_with_cache(ids, names=[POOLED_HOOK])
    return acts[POOLED_HOOK].mean(axis=0, dtype=np.float64).astype(np.float32)  # (hidden,)


def _inputs(model: Model, body: dict[str, Any]) -> list[list[int]]:
    """The request's inputs, each as token ids."""
    given = body.get("input")
    if isinstance(given, str) or (isinstance(given, list) and given and all(
            isinstance(t, int) and not isinstance(t, bool) for t in given)):
        given = [given]
    if not isinstance(given, list) or not given:
        raise ServeError("input must be a string, a list of strings, or token ids (a list, or a list of lists)",
                         param="input")
    if len(given) > MAX_INPUTS:
        raise LimitError(f"{len(given)} inputs is over this server's limit of {MAX_INPUTS} per request",
                         status=400)
    out = []
    for i, item in enumerate(given):
        if isinstance(item, str) and item:
            ids = model.tokenize(item)
        elif isinstance(item, list) and item and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            ids = item
        else:
            raise ServeError(f"input[{i}] must be a non-empty string or a non-empty list of token ids", param="input")
        model.check_fits(ids)
        out.append(ids)
    return out


def _run(server: ServerState, sess: ClientSession | None, body: dict[str, Any]) -> dict[str, Any]:
    model = sess.view.model() if sess is not None else server.served.model
    if model is None:
        raise ServeError("this vindex is browse-level: embeddings need model weights (extract it WITH INFERENCE)")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise ServeError(f'encoding_format must be "float" or "base64", got {fmt!r}', param="encoding_format")
    dims = body.get("dimensions")
    if dims is not None and dims != model.config.hidden:
        raise ServeError(f"dimensions must be left out or {model.config.hidden} (the model's hidden width); "
                         f"got {dims!r}", param="dimensions")
    inputs = _inputs(model, body)
    if sess is not None:
        with sess.lock:  # the session's overlay may not change under a forward pass
            vectors = [embed(model, ids) for ids in inputs]
    else:
        vectors = [embed(model, ids) for ids in inputs]
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") if fmt == "base64"
             else [float(x) for x in v]} for i, v in enumerate(vectors)]
    n = sum(len(ids) for ids in inputs)
    return {"object": "list", "data": data, "model": server.served.name,
            "usage": {"prompt_tokens": n, "total_tokens": n}}


async def embeddings(request: Request) -> Response:
    server = state(request)
    body = await read_json(request)
    out = await server.run(_run, server, server.session_of(request), body, deadline=server.deadline())
    return LarqlJSON(out)
