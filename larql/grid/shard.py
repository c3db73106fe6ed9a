"""The body of a Ray FFN shard (cluster.py makes it an actor): the model opened memory-mapped in the
actor's process, and the FFN of its layer range (or its experts of those layers) computed on the
rows a client sends, with the client's edits of those layers when it has some (edits.py).

Rows travel as float32 both ways (the local model bit for bit), or float16 when the client asks
for it; the answer has the dtype of the rows. Nothing here imports Ray at module level, so the
shard also runs in-process (the tests of its refusals, the benchmark's baseline).
"""

from __future__ import annotations

import os
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from larql.edit.state.load_any import load_any
from larql.errors import ServeError
from larql.grid.edits import FrozenEdits, Snapshot
from larql.grid.layout import Shard, check

if TYPE_CHECKING:
    from larql.model.model import Model

F32 = NDArray[np.float32]
WIRE = (np.dtype(np.float32), np.dtype(np.float16))


class FFNShard:
    """A layer range's FFN, or an expert range of it, over the model at `src` (an alias, a GGUF file,
    an HF directory or a vindex, as `larql.load` takes). `latency` seconds are slept before each
    answer: a simulated network, for benchmarks and for tests of the client's timeout."""

    def __init__(self, src: str, shard: Shard, latency: float = 0.0) -> None:
        self.src, self.shard, self.latency = src, shard, latency
        self.base = load_any(src).dense()
        check([shard], self.base.config)
        self._edited: tuple[Hashable, Model] | None = None

    def info(self) -> dict[str, Any]:
        """What the client checks the shard against: the model's shape and this shard's ranges."""
        c = self.base.config
        return {"model": self.base.name, "layers": c.n_layers, "hidden": c.hidden, "n_experts": c.n_experts,
                "ffn_layers": list(self.shard.layers),
                "experts": list(self.shard.experts) if self.shard.experts else None, "pid": os.getpid()}

    def warm(self) -> int:
        """Run the shard's layers once on a zero row (numba's kernels compiled or loaded, the
        weights' pages read) so that the first token does not wait for it; the process id."""
        h = np.zeros((1, self.base.config.hidden), dtype=np.float32)
        a, b = self.shard.layers
        for i in range(a, b + 1):
            if self.shard.experts is None:
                self.base.ffn_block(i, h)
            elif self.base.weights.layers[i].router is not None:
                self.base.expert_outputs(i, [self.shard.experts[0]], [h])
        return os.getpid()

    def ffn(self, layer: int, rows: NDArray[Any], edits_key: Hashable = None, edits_box: list[Any] | None = None
            ) -> NDArray[Any]:
        """Layer `layer`'s FFN output for its normed input `rows` `(T, hidden)`."""
        if self.shard.experts is not None:
            raise ServeError(f"this shard computes {self.shard.label()}, not whole FFN layers")
        if not self.shard.has_layer(layer):
            raise ServeError(f"this shard computes the FFN of {self.shard.label()}, not layer {layer}")
        h = self._rows(rows)
        out = self._model(edits_key, edits_box).ffn_block(layer, h)
        return self._answer(out, rows.dtype)

    def experts(self, layer: int, experts: list[int], rows: NDArray[Any], counts: list[int],
                edits_key: Hashable = None, edits_box: list[Any] | None = None) -> NDArray[Any]:
        """Each expert's gated FFN on its rows (expert k's `counts[k]` rows one after another in
        `rows`), before the router's weighting, in the same layout."""
        s = self.shard
        if s.experts is None:
            raise ServeError(f"this shard computes the whole FFN of {s.label()}, not experts")
        if not s.has_layer(layer) or self.base.weights.layers[layer].router is None:
            raise ServeError(f"this shard computes {s.label()} with a router, not layer {layer}")
        if len(experts) != len(counts) or any(n < 1 for n in counts) or sum(counts) != len(rows):
            raise ServeError("experts and counts must be lists of the same length, each expert with 1 row or more, "
                             "the counts summing to the rows sent")
        if not all(s.has_expert(e) for e in experts):
            raise ServeError(f"this shard computes {s.label()}, not experts {sorted(set(experts))}")
        xs = np.split(self._rows(rows), np.cumsum(counts)[:-1])
        ys = self._model(edits_key, edits_box).expert_outputs(layer, list(experts), xs)
        return self._answer(np.concatenate(ys), rows.dtype)

    def _rows(self, rows: NDArray[Any]) -> F32:
        hidden = self.base.config.hidden
        if rows.dtype not in WIRE or rows.ndim != 2 or rows.shape[1] != hidden:
            raise ServeError(f"the rows must be (tokens x {hidden}) float32 or float16, got {rows.dtype} "
                             f"{list(rows.shape)}")
        return np.ascontiguousarray(rows, dtype=np.float32)

    def _answer(self, out: F32, dtype: np.dtype[Any]) -> NDArray[Any]:
        if self.latency:
            time.sleep(self.latency)
        return np.ascontiguousarray(out, dtype=dtype)

    def _model(self, key: Hashable, box: list[Any] | None) -> Model:
        """The model without edits (key None), or with the client's edits named by `key`: the snapshot
        in `box` (itself, or a reference to it in Ray's object store) is read once per key."""
        if key is None:
            return self.base
        if self._edited is not None and self._edited[0] == key:
            return self._edited[1]
        if not box:
            raise ServeError("the client has edits but sent none to the shard")
        snap = box[0]
        if not isinstance(snap, Snapshot):  # an object reference, resolved here (Ray leaves nested ones alone)
            import ray

            snap = ray.get(snap)
        model = self.base.with_edits(FrozenEdits(snap))
        self._edited = (key, model)
        return model
