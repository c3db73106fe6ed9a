"""GET|POST /v1/attention: every head's attention pattern for a prompt, at one layer or all.

    {"prompt": "...", "layer": 5}   (layer left out: every layer, while the answer stays small)
 -> {"model", "prompt", "ids", "tokens", "layers": [5], "heads": 4,
     "patterns": [[[[...]]]]}      one (heads x queries x keys) array per layer

`patterns[i][h][q][k]` is how much query position q of head h at `layers[i]` attends to key k
(`larql.model.interp.attention_patterns`: a row sums to 1; keys after q are 0). The values are the
float32 softmax as computed, unrounded. A client with a session sees its own edits (an FFN edit
changes the later layers' inputs). The console draws these as heatmaps.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from larql.errors import LimitError, ServeError
from larql.serve.http import LarqlJSON, ServerState, read_json, state
from larql.serve.sessions import ClientSession

MAX_PROMPT_TOKENS = 256
MAX_VALUES = 1 << 21  # numbers in one answer (about 40 MB of JSON): past it, ask for one layer


def _patterns(server: ServerState, sess: ClientSession | None, prompt: str, layer: int | None) -> dict[str, Any]:
    from larql.model.interp import attention_patterns

    model = sess.view.model() if sess is not None else server.served.model
    if model is None:
        raise ServeError("this vindex is browse-level: attention needs model weights (extract it WITH INFERENCE)")
    ids = model.tokenize(prompt)
    if len(ids) > MAX_PROMPT_TOKENS:
        raise LimitError(f"the prompt is {len(ids)} tokens; attention patterns are served for at most "
                         f"{MAX_PROMPT_TOKENS}", status=400)
    c = model.config
    layers = list(range(c.n_layers)) if layer is None else [layer]
    if len(layers) * c.n_heads * len(ids) ** 2 > MAX_VALUES:
        raise LimitError(f"every layer's patterns for {len(ids)} tokens are {len(layers) * c.n_heads * len(ids) ** 2:,} "
                         f"numbers (at most {MAX_VALUES:,} in one answer): ask for one layer", status=400)
    if sess is not None:
        with sess.lock:  # the session's overlay may not change under a forward pass
            got = attention_patterns(model, ids, layers)
    else:
        got = attention_patterns(model, ids, layers)
    return {"model": server.served.name, "prompt": prompt, "ids": got.ids, "tokens": got.tokens,
            "layers": got.layers, "heads": c.n_heads, "patterns": got.pattern.tolist()}


async def attention(request: Request) -> Response:
    server = state(request)
    params: dict[str, Any] = dict(request.query_params)
    if request.method == "POST":
        params.update(await read_json(request))
    prompt = params.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise ServeError("the parameter 'prompt' is required")
    layer = params.get("layer")
    if layer is not None and layer != "":
        try:
            layer = int(layer)
        except (TypeError, ValueError):
            raise ServeError(f"layer must be an integer, got {layer!r}") from None
    else:
        layer = None
    out = await server.run(_patterns, server, server.session_of(request), prompt, layer, deadline=server.deadline())
    return LarqlJSON(out)


def routes() -> list[BaseRoute]:
    return [Route("/v1/attention", attention, methods=["GET", "POST"])]
