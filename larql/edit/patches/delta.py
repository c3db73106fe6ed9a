"""The low-rank weight delta of ROME and MEMIT: one type from the solve, through the overlay, to the
patch file (`WeightOp` is this delta with the facts it teaches)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

F32 = NDArray[np.float32]


@dataclass(frozen=True)
class LowRankDelta:
    """dW = u @ v.T added to layer `layer`'s down projection, and the keys it was solved for (what
    later edits at the layer hold still)."""

    layer: int
    u: F32  # (hidden, r)
    v: F32  # (ffn, r)
    keys: F32  # (ffn, r)

    @property
    def rank(self) -> int:
        return int(self.u.shape[1])

    def dense(self) -> F32:
        """dW `(hidden, ffn)`."""
        return (self.u @ self.v.T).astype(np.float32)
