"""FFN strategies computed elsewhere (vindex_spec/SCALE_OUT.md): a model whose FFN, for a layer range
or a mixture of experts' expert range, runs on a `larql serve --ffn-only` shard (larql/serve/ffn_remote.py,
expert_remote.py) and everywhere else locally.

`use_remote_ffn(model, url)` (the CLI's `larql run ... --ffn URL`, repeatable: wrappers compose) is the
model with the FFN of layers A..B computed by the server. The bytes go both ways as they are, so it
is the local model bit for bit when both hold the same weights. Hooks inside a remote FFN
(`mlp.hook_pre`, `mlp.hook_post`) cannot run there and are refused; `hook_mlp_out` runs here. On an
expert shard the router runs here, the shard's experts there and the rest locally (or on the next
shard), and the weighted sum is taken here in the local order. A layer the client has edited (an
edit session's overlay) is refused: the server would compute it unedited.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import ServeError, UnsupportedError
from larql.model.ffn import FFN, ExpertHooks, FFNEdits
from larql.model.hooks import HookFns, run_hook

if TYPE_CHECKING:
    from larql.model.model import Model

F32 = NDArray[np.float32]
OCTETS = "application/octet-stream"  # the wire format both ways: float32 rows, little-endian


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
        refuse_edits(self.edits, i, self.url)
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


def refuse_edits(edits: FFNEdits | None, i: int, url: str) -> None:
    """Refuse a layer the client has edited: the server computes it from its own weights and would
    answer unedited (Ray shards carry a client's edits: larql/grid/)."""
    if edits is None:
        return
    if (edits.top_k is not None or edits.feature_overrides(i) or edits.deleted(i) or edits.down_delta(i) is not None
            or edits.added(i) is not None):
        raise UnsupportedError(f"layer {i} is edited here and its FFN runs on {url}, which would answer without the "
                               f"edits: run the layer locally, or on Ray shards (--ray), which carry them")


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
        if got.get("n_experts") != c.n_experts:
            raise ServeError(f"{url} serves a model with {got.get('n_experts')} experts, {model.name} has "
                             f"{c.n_experts}")
        e_lo, e_hi = got["experts"]
        return model.with_ffn(lambda local: RemoteExperts(local, url, (a, b), (e_lo, e_hi), c.hidden, client))
    return model.with_ffn(lambda local: RemoteFFN(local, url, (a, b), c.hidden, client))


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
        refuse_edits(self.edits, i, self.url)
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
