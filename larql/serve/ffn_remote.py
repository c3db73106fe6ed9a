"""The scale-out seam's server side (vindex_spec/SCALE_OUT.md): a layer range's FFN over HTTP.

`larql serve VINDEX|MODEL --ffn-only --layers A-B` answers only (with `--experts E1-E2`, a
mixture of experts' expert range: larql/serve/expert_remote.py)

    GET  /v1/health
    GET  /v1/info                  {"kind": "ffn", "model", "layers", "hidden", "ffn_layers": [A, B]}
    POST /v1/ffn?layer=i           body: the FFN's normed input h, (T, hidden) float32 little-endian bytes
                                   answer: the FFN's output, (T, hidden) float32 bytes

The FFN is the served model's (a vindex's is its walk FFN, with its patches). The client,
`use_remote_ffn(model, url)` (`larql run ... --ffn URL`), is an FFN strategy: larql/model/remote_ffn.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from larql.errors import ServeError
from larql.model.remote_ffn import OCTETS
from larql.serve.http import LarqlJSON, read_body, state
from larql.serve.shard import served_model, served_range
from larql.version import __version__

if TYPE_CHECKING:
    from larql.model.model import Model

F32 = NDArray[np.float32]


async def info(request: Request) -> Response:
    server = state(request)
    model = served_model(server)
    c, experts = model.config, server.config.ffn_experts
    return LarqlJSON({"kind": "ffn", "model": server.served.name, "version": __version__, "layers": c.n_layers,
                      "hidden": c.hidden, "ffn_layers": list(served_range(server, model)),
                      "n_experts": c.n_experts, "experts": list(experts) if experts else None})


async def health(request: Request) -> Response:
    return LarqlJSON({"status": "ok", "version": __version__})


def _run_ffn(model: Model, layer: int, h: F32) -> bytes:
    return np.ascontiguousarray(model.ffn_block(layer, h), dtype="<f4").tobytes()


async def ffn(request: Request) -> Response:
    server = state(request)
    model = served_model(server)
    if server.config.ffn_experts is not None:
        e, f = server.config.ffn_experts
        raise ServeError(f"this server computes experts {e}-{f} only: POST /v1/experts")
    a, b = served_range(server, model)
    try:
        layer = int(request.query_params.get("layer", ""))
    except ValueError:
        raise ServeError("give the layer: POST /v1/ffn?layer=N") from None
    if not a <= layer <= b:
        raise ServeError(f"this server computes the FFN of layers {a}-{b}, not layer {layer}")
    hidden = model.config.hidden
    body = await read_body(request, server)
    if not body or len(body) % (4 * hidden):
        raise ServeError(f"the body must be (tokens x {hidden}) float32 values, got {len(body)} bytes")
    h = np.frombuffer(body, dtype="<f4").astype(np.float32).reshape(-1, hidden)
    out = await server.run(_run_ffn, model, layer, h, deadline=server.deadline())
    return Response(out, media_type=OCTETS)


def routes() -> list[BaseRoute]:
    from larql.serve import expert_remote

    return [Route("/v1/health", health), Route("/v1/info", info), Route("/v1/ffn", ffn, methods=["POST"]),
            *expert_remote.routes()]
