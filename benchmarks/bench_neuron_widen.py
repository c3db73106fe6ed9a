"""Experiment: METHOD NEURON with its neurons ADDED to a layer instead of taking over its cheapest
features — emulated, to measure what a wider FFN would buy before building it.

Today a neuron recycles a slot: the slot's old feature is gone from every other token
(`bench_slot_cost.py`: the 167 cheapest features of each of layers 3-8 deleted, no neuron at all,
keep only 17 of 24 unrelated top-1s). Here the forward pass computes every base feature as the
unedited model does and adds each neuron's own output on top, act(gate·h, up·h) down — what an FFN
widened by one feature per neuron computes (its down also carries the slot's old output at the
subject, `neuron.plan_neuron_edit`: ~0.02 against a value of norm 10-30). The value step's tail
(model/grad.py) still sees recycled slots, so the emulation is, if anything, pessimistic.

    python benchmarks/bench_neuron_widen.py --vindex g.vindex --data benchmarks/data/fictional_1000.json \\
        --methods neuron --protocols stacked [--every 3 --limit 300] [--name NAME]

Takes bench_editing.py's arguments and writes its JSON (benchmarks/results/editing-NAME.json).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

import larql.threads

larql.threads.configure()

from larql.model.ffn import FFN, gated  # noqa: E402  (after threads.configure, before numpy's BLAS starts)

F32 = NDArray[np.float32]
_base_call = FFN.__call__


class _WithoutNeurons:
    """The overlay's edits less the neuron slots (every other edit as it is)."""

    def __init__(self, edits: Any, neurons: set[int]) -> None:
        self.edits, self.neurons = edits, neurons
        self.top_k, self.revision = edits.top_k, edits.revision

    def feature_overrides(self, layer: int) -> Mapping[int, Any]:
        return {f: o for f, o in self.edits.feature_overrides(layer).items() if f not in self.neurons}

    def deleted(self, layer: int) -> Any:
        return self.edits.deleted(layer)

    def down_delta(self, layer: int) -> Any:
        return self.edits.down_delta(layer)

    def __len__(self) -> int:
        return len(self.edits)


def _added_neurons_call(self: FFN, i: int, h: F32, hooks: Any, start: int) -> F32:
    edits = self.edits
    overrides = edits.feature_overrides(i) if edits is not None else {}
    neurons = {f: o for f, o in overrides.items() if all(part is not None for part in o)}
    if not neurons:
        return _base_call(self, i, h, hooks, start)
    self.edits = _WithoutNeurons(edits, set(neurons))  # type: ignore[assignment]
    try:
        out = _base_call(self, i, h, hooks, start)  # (T, hidden): every base feature intact
    finally:
        self.edits = edits
    gate = np.stack([o[0] for o in neurons.values()])  # (n, hidden)
    up = np.stack([o[1] for o in neurons.values()])
    down = np.stack([o[2] for o in neurons.values()])  # (n, hidden)
    return out + gated(self.activation, h @ gate.T, h @ up.T) @ down  # (T, hidden)


def main() -> None:
    FFN.__call__ = _added_neurons_call  # type: ignore[method-assign]
    import bench_editing

    sys.argv = ["bench_editing.py", *sys.argv[1:]]
    bench_editing.main()


if __name__ == "__main__":
    main()
