"""The scale-out seam (vindex_spec/SCALE_OUT.md): a layer range's FFN served over HTTP, and a model
that uses it.

Server: `larql serve VINDEX|MODEL --ffn-only --layers A-B` answers only (with `--experts E1-E2`, a
mixture of experts' expert range: larql/serve/expert_remote.py)

    GET  /v1/health
    GET  /v1/info                  {"kind": "ffn", "model", "layers", "hidden", "ffn_layers": [A, B]}
    POST /v1/ffn?layer=i           body: the FFN's normed input h, (T, hidden) float32 little-endian bytes
                                   answer: the FFN's output, (T, hidden) float32 bytes

The FFN is the served model's (a vindex's is its walk FFN, with its patches). Client:
`use_remote_ffn(model, url)` (the CLI's `larql run ... --ffn URL`) is the model with the FFN of
layers A..B computed by the server and every other layer locally; the bytes go both ways as they are,
so it is the local model bit for bit when both hold the same weights. Hooks inside a remote FFN
(`mlp.hook_pre`, `mlp.hook_post`) cannot run there and are refused; `hook_mlp_out` runs here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from larql.errors import LimitError, ServeError, UnsupportedError
from larql.model.ffn import FFN
from larql.model.hooks import HookFns, run_hook
from larql.serve.app import LarqlJSON, ServerState, state
from larql.version import __version__

if TYPE_CHECKING:
    from larql.model.model import Model

F32 = NDArray[np.float32]
OCTETS = "application/octet-stream"


def parse_layers(text: str, flag: str = "--layers") -> tuple[int, int]:
    """'4-11' -> (4, 11); '7' -> (7, 7)."""
    what = "layer" if flag == "--layers" else "expert"
    lo, _, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise ServeError(f"{flag} must be a{'n' if what == 'expert' else ''} {what} range such as 4-11, "
                         f"got {text!r}") from None
    if not 0 <= a <= b:
        raise ServeError(f"{flag} {text}: the range must run upwards from {what} 0 or later")
    return a, b


# ---- server ---------------------------------------------------------------------------------------

def served_model(server: ServerState) -> Model:
    model = server.served.model
    if model is None:
        raise ServeError("this vindex is browse-level: an FFN server needs model weights (extract it WITH INFERENCE)")
    return model


def served_range(server: ServerState, model: Model) -> tuple[int, int]:
    """The layers this server computes: --layers, or every layer when it serves --experts alone."""
    return server.config.ffn_layers or (0, model.config.n_layers - 1)


def check_range(server: ServerState) -> None:
    """Refuse, at start, a layer (or expert) range the served model does not have."""
    model = served_model(server)
    a, b = served_range(server, model)
    n = model.config.n_layers
    if b >= n:
        raise ServeError(f"--layers {a}-{b}: {server.served.name} has layers 0..{n - 1}")
    if server.config.ffn_experts is not None:
        from larql.serve.expert_remote import check_experts

        check_experts(server, model)


async def info(request: Request) -> Response:
    server = state(request)
    model = served_model(server)
    c, experts = model.config, server.config.ffn_experts
    return LarqlJSON({"kind": "ffn", "model": server.served.name, "version": __version__, "layers": c.n_layers,
                      "hidden": c.hidden, "ffn_layers": list(served_range(server, model)),
                      "n_experts": c.n_experts, "experts": list(experts) if experts else None})


async def health(request: Request) -> Response:
    return LarqlJSON({"status": "ok", "version": __version__})


async def read_body(request: Request, server: ServerState) -> bytes:
    """The request's body (float32 rows), refused once it grows past the server's body limit."""
    limit = server.config.limits.max_body_bytes
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise LimitError(f"the request body is over this server's limit of {limit:,} bytes")
    return body


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


# ---- client ---------------------------------------------------------------------------------------

class RemoteFFN(FFN):
    """The local FFN, with layers first..last computed by an FFN server."""

    def __init__(self, local: FFN, url: str, layers: tuple[int, int], hidden: int, client: Any) -> None:
        self.__dict__.update(local.__dict__)  # the local FFN's weights, edits and hook names
        self.local, self.url, self.layers, self.hidden, self.client = local, url, layers, hidden, client

    def __call__(self, i: int, h: F32, hooks: HookFns | None, start: int) -> F32:
        a, b = self.layers
        if not a <= i <= b:
            return self.local(i, h, hooks, start)
        n = self.names[i]
        if hooks and (n.mlp_pre in hooks or n.mlp_post in hooks):
            raise UnsupportedError(f"layer {i}'s FFN runs on {self.url}: hooks inside it ({n.mlp_pre}, "
                                   f"{n.mlp_post}) cannot run there")
        import httpx

        try:
            r = self.client.post(f"{self.url}/v1/ffn", params={"layer": i}, headers={"content-type": OCTETS},
                                 content=np.ascontiguousarray(h, dtype="<f4").tobytes())
        except httpx.HTTPError as e:
            raise ServeError(f"the FFN server {self.url} did not answer for layer {i} ({e})") from e
        if r.status_code != 200:
            raise ServeError(f"the FFN server {self.url} refused layer {i}: {r.text[:300]}", status=r.status_code)
        out = np.frombuffer(r.content, dtype="<f4").astype(np.float32).reshape(h.shape[0], self.hidden)
        return run_hook(hooks, n.mlp_out, out, start) if hooks else out


def use_remote_ffn(model: Model, url: str, timeout: float = 120.0) -> Model:
    """`model` with the FFN of the layers the server at `url` serves computed there (checked: the same
    layer count and width)."""
    import httpx

    url = url.rstrip("/")
    client = httpx.Client(timeout=timeout)
    try:
        got = client.get(f"{url}/v1/info").json()
    except (httpx.HTTPError, ValueError) as e:
        raise ServeError(f"{url}: not an FFN server that answers ({e})") from e
    if got.get("kind") != "ffn":
        raise ServeError(f"{url}: not an FFN server (start one with larql serve MODEL --ffn-only --layers A-B)")
    c = model.config
    if (got.get("layers"), got.get("hidden")) != (c.n_layers, c.hidden):
        raise ServeError(f"{url} serves {got.get('model')} ({got.get('layers')} layers, width {got.get('hidden')}), "
                         f"not a model shaped like {model.name} ({c.n_layers} layers, width {c.hidden})")
    a, b = got["ffn_layers"]
    if got.get("experts"):  # an expert shard: the router stays here (larql/serve/expert_remote.py)
        from larql.serve.expert_remote import RemoteExperts

        if got.get("n_experts") != c.n_experts:
            raise ServeError(f"{url} serves a model with {got.get('n_experts')} experts, {model.name} has "
                             f"{c.n_experts}")
        e_lo, e_hi = got["experts"]
        return model.with_ffn(lambda local: RemoteExperts(local, url, (a, b), (e_lo, e_hi), c.hidden, client))
    return model.with_ffn(lambda local: RemoteFFN(local, url, (a, b), c.hidden, client))
