"""Expert shards (vindex_spec/SCALE_OUT.md): a mixture of experts' expert range served over HTTP,
and a model whose router, run locally, sends each expert's rows to the shard that holds it.

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

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from larql.errors import ServeError, UnsupportedError
from larql.model.ffn import FFN, ExpertHooks
from larql.model.hooks import HookFns
from larql.serve.app import ServerState, state

if TYPE_CHECKING:
    from larql.model.model import Model

F32 = NDArray[np.float32]
OCTETS = "application/octet-stream"


def check_experts(server: ServerState, model: Model) -> None:
    """Refuse, at start, an expert range the served model does not have."""
    assert server.config.ffn_experts is not None
    a, b = server.config.ffn_experts
    n = model.config.n_experts
    if not n:
        raise ServeError(f"--experts {a}-{b}: {server.served.name} is not a mixture of experts")
    if b >= n:
        raise ServeError(f"--experts {a}-{b}: {server.served.name} has experts 0..{n - 1}")


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
    from larql.serve.ffn_remote import read_body, served_model, served_range

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


# ---- client ---------------------------------------------------------------------------------------

class RemoteExperts(FFN):
    """The local FFN, with experts e_lo..e_hi of layers lo..hi computed by an expert shard."""

    def __init__(self, local: FFN, url: str, layers: tuple[int, int], experts: tuple[int, int], hidden: int,
                 client: Any) -> None:
        self.__dict__.update(local.__dict__)  # the local FFN's weights, edits and hook names
        self.local, self.url, self.layers, self.experts, self.hidden, self.client = \
            local, url, layers, experts, hidden, client

    def __call__(self, i: int, h: F32, hooks: HookFns | None, start: int) -> F32:
        a, b = self.layers
        if not a <= i <= b or self.weights.layers[i].router is None:
            return self.local(i, h, hooks, start)
        return FFN.__call__(self, i, h, hooks, start)  # the router here; expert_outputs below

    def expert_outputs(self, i: int, experts: list[int], xs: list[F32],
                       hooked: ExpertHooks | None = None) -> list[F32]:
        lo, hi = self.experts
        mine = [k for k, e in enumerate(experts) if lo <= e <= hi]
        rest = [k for k, e in enumerate(experts) if not lo <= e <= hi]
        if hooked is not None and any(experts[k] in hooked.experts for k in mine):
            raise UnsupportedError(f"layer {i}: per-expert hook points of experts {lo}-{hi}, which {self.url} "
                                   f"computes; hook them where that shard runs, or run the model locally")
        out: list[F32 | None] = [None] * len(experts)
        if rest:  # the local FFN's, or the next shard's
            sub = None if hooked is None else replace(hooked, rows=[hooked.rows[k] for k in rest])
            for k, y in zip(rest, self.local.expert_outputs(i, [experts[k] for k in rest], [xs[k] for k in rest],
                                                            sub)):
                out[k] = y
        if mine:
            for k, y in zip(mine, self._ask(i, [experts[k] for k in mine], [xs[k] for k in mine])):
                out[k] = y
        return [y for y in out if y is not None]

    def _ask(self, i: int, experts: list[int], xs: list[F32]) -> list[F32]:
        import httpx

        rows = [len(x) for x in xs]
        params = {"layer": i, "experts": ",".join(map(str, experts)), "rows": ",".join(map(str, rows))}
        try:
            r = self.client.post(f"{self.url}/v1/experts", params=params, headers={"content-type": OCTETS},
                                 content=np.ascontiguousarray(np.concatenate(xs), dtype="<f4").tobytes())
        except httpx.HTTPError as e:
            raise ServeError(f"the expert server {self.url} did not answer for layer {i} ({e})") from e
        if r.status_code != 200:
            raise ServeError(f"the expert server {self.url} refused layer {i}: {r.text[:300]}", status=r.status_code)
        y = np.frombuffer(r.content, dtype="<f4").astype(np.float32).reshape(sum(rows), self.hidden)
        return np.split(y, np.cumsum(rows)[:-1])
