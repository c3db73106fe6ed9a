"""The client side: a model whose FFN, for the shards' layers (or experts), is computed by Ray actors.

`use_ray(model, layers="4-7,8-11", address="local")` starts the shards (cluster.py) and returns the
model with its FFN block wrapped (`Model.with_ffn`, the same seam as the HTTP client,
model/remote_ffn.py): a layer of a layer shard sends its rows to that shard's actor and takes the
answer as the FFN's output; in a layer of experts the router runs here, each shard computes its
experts' rows (the shards of a layer are asked at once) and the weighted sum is taken here in the
local order. Float32 rows both ways by default, so the model is the local one bit for bit; the
client's edits of a shard's layers travel to it (edits.py). `RayGrid` is the same in two steps,
for a caller that wants the actors (replicas, kill, call counts).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import RemoteError, ServeError, UnsupportedError
from larql.grid.cluster import Options, ShardGroup, connect, import_ray, start_groups
from larql.grid.edits import snapshot
from larql.grid.layout import Shard, layout
from larql.model.ffn import FFN, ExpertHooks
from larql.model.hooks import HookFns, run_hook

if TYPE_CHECKING:
    from larql.model.model import Model

F32 = NDArray[np.float32]
_fresh = itertools.count()  # edit keys for an edit strategy that cannot say whether it changed


class RayGrid:
    """Shards started as Ray actors for one model source; `attach(model)` wraps a model's FFN."""

    def __init__(self, groups: list[ShardGroup], info: dict[str, Any], options: Options) -> None:
        self.groups, self.info, self.options = groups, info, options

    @classmethod
    def start(cls, src: str, model: Model, layers: str | None = None, experts: str | None = None,
              address: str = "local", options: Options | None = None) -> RayGrid:
        """Actors for the shards `layers` / `experts` name (layout.py's spelling), each opening `src`."""
        options = options or Options()
        if options.replicas < 1:
            raise ServeError(f"--ray-replicas must be 1 or more, got {options.replicas}")
        shards = layout(model.config, layers, experts)
        connect(address, len(shards) * options.replicas * options.cpus)
        groups = start_groups(src, shards, options)
        info = groups[0].call("the info call", "info")
        return cls(groups, info, options)

    def attach(self, model: Model) -> Model:
        """`model` with the shards' layers (or experts) computed by them; checked: the same shape."""
        c, got = model.config, self.info
        if (got["layers"], got["hidden"], got["n_experts"]) != (c.n_layers, c.hidden, c.n_experts):
            raise RemoteError(f"the Ray shards serve {got['model']} ({got['layers']} layers, width {got['hidden']}, "
                              f"{got['n_experts']} experts), not a model shaped like {model.name}")
        return model.with_ffn(lambda local: RayFFN(local, self))

    def calls(self) -> list[tuple[str, list[int]]]:
        """Each shard's label and how many calls each of its replicas answered."""
        return [(g.shard.label(), list(g.calls)) for g in self.groups]

    def close(self) -> None:
        """End every shard's actors."""
        for g in self.groups:
            g.kill()


def use_ray(model: Model, layers: str | None = None, experts: str | None = None, address: str = "local",
            src: str | None = None, replicas: int = 1, float16: bool = False, timeout: float = 60.0) -> Model:
    """`model` with the FFN of `layers` ("4-7,8-11": one shard per range), or with `experts`
    ("0-1,2-3": one shard per expert range, of every layer with a router), computed by Ray actors,
    `replicas` per shard, on the cluster at `address` ("local" starts one here). The actors open
    `src` (default: the file or directory the model was loaded from).

    Example:
        >>> m = larql.use_ray(larql.load("gemma3-270m"), layers="4-7,8-11")
        >>> m.generate("The capital of France is", max_new_tokens=4).text
    """
    options = Options(replicas=replicas, float16=float16, timeout=timeout)
    grid = RayGrid.start(src or str(model.source), model, layers, experts, address, options)
    return grid.attach(model)


class RayFFN(FFN):
    """The local FFN, with the grid's layers or experts computed by its shards."""

    def __init__(self, local: FFN, grid: RayGrid) -> None:
        self.__dict__.update(local.__dict__)  # the local FFN's weights, edits and hook names
        self.local, self.grid = local, grid
        self.wire = np.dtype(np.float16 if grid.options.float16 else np.float32)
        self.by_layer = {i: g for g in grid.groups if g.shard.experts is None for i in _span(g.shard)}
        self.expert_layers = {i for g in grid.groups if g.shard.experts is not None for i in _span(g.shard)}
        # id(group) -> (the edits' key, what was sent for it: (None, None) for no edits in the group's layers)
        self._sent: dict[int, tuple[Hashable, tuple[Hashable, list[Any] | None]]] = {}

    def __call__(self, i: int, h: F32, hooks: HookFns | None, start: int) -> F32:
        if i in self.expert_layers and self.weights.layers[i].router is not None:
            return FFN.__call__(self, i, h, hooks, start)  # the router here; expert_outputs below
        group = self.by_layer.get(i)
        if group is None:
            return self.local(i, h, hooks, start)
        n = self.names[i]
        if hooks and (n.mlp_pre in hooks or n.mlp_post in hooks):
            raise UnsupportedError(f"layer {i}'s FFN runs on the Ray shard of {group.shard.label()}: hooks inside "
                                   f"it ({n.mlp_pre}, {n.mlp_post}) cannot run there")
        key, box = self._edits(group)
        rows = np.ascontiguousarray(h, dtype=self.wire)
        out = np.asarray(group.call(f"layer {i}", "ffn", i, rows, key, box), dtype=np.float32)
        return run_hook(hooks, n.mlp_out, out, start) if hooks else out

    def expert_outputs(self, i: int, experts: list[int], xs: list[F32],
                       hooked: ExpertHooks | None = None) -> list[F32]:
        groups = [g for g in self.grid.groups if g.shard.experts is not None and g.shard.has_layer(i)]
        owner = {k: next((g for g in groups if g.shard.has_expert(e)), None) for k, e in enumerate(experts)}
        if hooked is not None:
            for k, g in owner.items():
                if g is not None and experts[k] in hooked.experts:
                    raise UnsupportedError(f"layer {i}: per-expert hook points of expert {experts[k]}, which the Ray "
                                           f"shard of {g.shard.label()} computes; run the model locally to hook it")
        out: list[F32 | None] = [None] * len(experts)
        rest = [k for k, g in owner.items() if g is None]
        asked = [(g, [k for k, o in owner.items() if o is g]) for g in groups]
        asked = [(g, ks) for g, ks in asked if ks]
        refs = [self._submit(i, g, [experts[k] for k in ks], [xs[k] for k in ks]) for g, ks in asked]
        if rest:  # the local FFN's (or the next wrapper's), while the shards compute theirs
            sub = None if hooked is None else replace(hooked, rows=[hooked.rows[k] for k in rest])
            for k, y in zip(rest, self.local.expert_outputs(i, [experts[k] for k in rest], [xs[k] for k in rest],
                                                            sub)):
                out[k] = y
        for (_, ks), pending in zip(asked, refs):
            ys = pending()
            for k, y in zip(ks, ys):
                out[k] = y
        return [y for y in out if y is not None]

    def _submit(self, i: int, group: ShardGroup, experts: list[int], xs: list[F32]) -> Callable[[], list[F32]]:
        """Ask `group` for its experts' rows now; returns a function that waits for the answer."""
        counts = [len(x) for x in xs]
        key, box = self._edits(group)
        rows = np.ascontiguousarray(np.concatenate(xs), dtype=self.wire)
        pending = group.submit(f"layer {i}'s experts {experts}", "experts", i, experts, rows, counts, key, box)

        def wait() -> list[F32]:
            return np.split(np.asarray(pending(), dtype=np.float32), np.cumsum(counts)[:-1])

        return wait

    def _edits(self, group: ShardGroup) -> tuple[Hashable, list[Any] | None]:
        """The key of the client's current edits of `group`'s layers (None: none) and the box holding
        their snapshot (put in Ray's object store once per key)."""
        if self.edits is None:
            return None, None
        revision = getattr(self.edits, "revision", None)
        key: Hashable = (id(self.edits), revision) if revision is not None else ("once", next(_fresh))
        kept = self._sent.get(id(group))
        if kept is not None and kept[0] == key:
            return kept[1]
        snap = snapshot(self.edits, _span(group.shard))
        sent: tuple[Hashable, list[Any] | None] = (None, None) if snap.empty() else (key, [import_ray().put(snap)])
        self._sent[id(group)] = (key, sent)
        return sent


def _span(shard: Shard) -> range:
    return range(shard.layers[0], shard.layers[1] + 1)
