"""Two matrices of one type times one activation in one parallel region: a decode layer's q and k, and
its gate and up, each pair reading the same normed residual.

A decode step runs ~7 matvecs a layer, each its own parallel region: the other thread woken, the rows
split, both joined. The small ones (q, k, v of a 4B Gemma 3: 1-3 MB) ran at 3.5 GB/s where the FFN's
15 MB matrices reach 5.8 on the same busy machine (benchmarks/profile_decode.py). Here the two
matrices' rows are one range split between the threads, the activation put in lane order once for
both. Each row is the one-matrix kernel's one-row code on the same inputs: the same bits (test).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit, prange
from numpy.typing import NDArray

from larql.quant.kquant_rows import LANES_Q4_K, Q4_K_ROW, Q5_0_ROW, group_sums, in_lane_order
from larql.quant.types import GGMLType

F32 = NDArray[np.float32]
U8 = NDArray[np.uint8]


@njit(cache=True, parallel=True)
def matvec_q4_k_pair(w1: U8, w2: U8, x: F32, out1: F32, out2: F32) -> None:  # pragma: no cover - numba
    """out1 = w1 x and out2 = w2 x for Q4_K blocks w1 `[rows1, bytes]`, w2 `[rows2, bytes]`, a row a call."""
    xsum = group_sums(x)
    xl = in_lane_order(x, LANES_Q4_K)
    n1 = w1.shape[0]
    for r in prange(n1 + w2.shape[0]):
        if r < n1:
            Q4_K_ROW(w1, r, xl, xsum, out1)
        else:
            Q4_K_ROW(w2, r - n1, xl, xsum, out2)


@njit(cache=True, parallel=True)
def matvec_q5_0_pair(w1: U8, w2: U8, x: F32, out1: F32, out2: F32) -> None:  # pragma: no cover - numba
    """out1 = w1 x and out2 = w2 x for Q5_0 blocks w1 `[rows1, bytes]`, w2 `[rows2, bytes]`."""
    n1 = w1.shape[0]
    for r in prange(n1 + w2.shape[0]):
        if r < n1:
            Q5_0_ROW(w1, r, x, x, out1)
        else:
            Q5_0_ROW(w2, r - n1, x, x, out2)


# the pair kernel of each type that has one: kernel(w1, w2, x, out1, out2)
PAIR: dict[int, Callable[[U8, U8, F32, F32, F32], None]] = {
    int(GGMLType.Q4_K): matvec_q4_k_pair, int(GGMLType.Q5_0): matvec_q5_0_pair}
