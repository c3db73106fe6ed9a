"""Expert shards (vindex_spec/SCALE_OUT.md): a mixture of experts' expert range served over HTTP;
the client, a model whose router, run locally, sends each expert's rows to the shard that holds it,
is larql/model/remote_ffn.py.

Server: `larql serve MODEL --ffn-only --experts E1-E2 [--layers A-B]` answers (beside /v1/health
and /v1/info, whose "experts" is [E1, E2])

    POST /v1/experts?layer=i&experts=3,5&rows=2,4
        body: expert 3's rows then expert 5's, (2 + 4, hidden) float32 little-endian bytes, the
        normed FFN input of the positions the router sent to each
        answer: each expert's gated FFN output on its rows, before the router's weighting, the
        same (6, hidden) float32 bytes

Client: `use_remote_ffn(model, url)` on such a server (or `larql run ... --ffn URL`, repeatable)
wraps the model's FFN so that in the shard's layers the router runs here, the experts E1..E2 run
on the shard and the rest locally (or on the next shard: wrappers compose), and the weighted sum is
taken here in the local order, so the logits are the local model's bit for bit when both sides hold
the same weights.
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
from larql.serve.http import read_body, state
from larql.serve.shard import served_model, served_range

if TYPE_CHECKING:
    from larql.model.model import Model

F32 = NDArray[np.float32]


def _ints(request: Request, key: str) -> list[int]:
    try:
        return [int(v) for v in request.query_params.get(key, "").split(",")]
    except ValueError:
        raise ServeError(f"give {key} as comma-separated integers: POST /v1/experts?layer=N&experts=3,5&rows=2,4") \
            from None


def _run(model: Model, layer: int, experts: list[int], xs: list[F32]) -> bytes:
    ys = model.expert_outputs(layer, experts, xs)
    return np.ascontiguousarray(np.concatenate(ys), dtype="<f4").tobytes()


async def experts(request: Request) -> Response:
    server = state(request)
    model = served_model(server)
    lo, hi = served_range(server, model)
    e_lo, e_hi = server.config.ffn_experts or (0, -1)
    try:
        layer = int(request.query_params.get("layer", ""))
    except ValueError:
        raise ServeError("give the layer: POST /v1/experts?layer=N&experts=3,5&rows=2,4") from None
    if not lo <= layer <= hi or model.weights.layers[layer].router is None:
        raise ServeError(f"this server computes the experts of layers {lo}-{hi} with a router, not layer {layer}")
    wanted, rows = _ints(request, "experts"), _ints(request, "rows")
    if len(wanted) != len(rows) or any(n < 1 for n in rows):
        raise ServeError("experts and rows must be lists of the same length, each expert with 1 row or more")
    if not all(e_lo <= e <= e_hi for e in wanted):
        raise ServeError(f"this server computes experts {e_lo}-{e_hi}, not {sorted(set(wanted))}")
    hidden = model.config.hidden
    body = await read_body(request, server)
    if len(body) != 4 * hidden * sum(rows):
        raise ServeError(f"the body must be {sum(rows)} x {hidden} float32 values (the rows), got {len(body)} bytes")
    h = np.frombuffer(body, dtype="<f4").astype(np.float32).reshape(-1, hidden)
    xs = np.split(h, np.cumsum(rows)[:-1])
    out = await server.run(_run, model, layer, wanted, xs, deadline=server.deadline())
    return Response(out, media_type=OCTETS)


def routes() -> list[BaseRoute]:
    return [Route("/v1/experts", experts, methods=["POST"])]
