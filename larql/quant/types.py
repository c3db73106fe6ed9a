"""GGML tensor types: the one table of (block_size, type_size) and the byte-shape helpers."""

from __future__ import annotations

from enum import IntEnum

from larql.errors import QuantError, UnsupportedError


class GGMLType(IntEnum):
    """Tensor types as numbered in the GGUF format (ggml.h)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30


# type -> (weights per block, bytes per block). The only place these numbers live.
BLOCK_LAYOUT: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.Q4_0: (32, 2 + 16),
    GGMLType.Q4_1: (32, 2 + 2 + 16),
    GGMLType.Q5_0: (32, 2 + 4 + 16),
    GGMLType.Q5_1: (32, 2 + 2 + 4 + 16),
    GGMLType.Q8_0: (32, 2 + 32),
    GGMLType.Q4_K: (256, 2 + 2 + 12 + 128),
    GGMLType.Q5_K: (256, 2 + 2 + 12 + 32 + 128),
    GGMLType.Q6_K: (256, 128 + 64 + 16 + 2),
}


def ggml_type(code: int, where: str = "tensor") -> GGMLType:
    """The GGMLType for a numeric type code, or UnsupportedError naming `where`."""
    try:
        qtype = GGMLType(code)
    except ValueError:
        raise UnsupportedError(
            f"{where}: ggml type {code} is not supported "
            f"(supported: {', '.join(t.name for t in BLOCK_LAYOUT)})"
        ) from None
    return qtype


def row_bytes(qtype: GGMLType, n_cols: int) -> int:
    """Bytes taken by one row of `n_cols` weights of type `qtype`."""
    block_size, type_size = BLOCK_LAYOUT[qtype]
    if n_cols % block_size:
        raise QuantError(
            f"a {qtype.name} row of {n_cols} weights is not a whole number of {block_size}-weight blocks"
        )
    return n_cols // block_size * type_size
