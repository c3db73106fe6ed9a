"""LLVM IR pieces the hand-written row kernels share (argmax.py, argmax_tiles.py, matvec_rows.py,
q8_0_rows.py, vindex/knn_kernels.py): a leaf module, so a kernel module that kernels.py imports can
use them without importing argmax (which imports kernels)."""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)


def ir_row(context, builder, arr_type, arr, r, block_bytes):  # type: ignore[no-untyped-def]
    """(a pointer to row r of a 2-D byte-addressed array, its number of `block_bytes` blocks)."""
    a = context.make_array(arr_type)(context, builder, arr)
    stride0 = cgutils.unpack_tuple(builder, a.strides)[0]
    n_blocks = builder.sdiv(cgutils.unpack_tuple(builder, a.shape)[1], ir.Constant(_I64, block_bytes))
    return builder.gep(a.data, [builder.mul(r, stride0)], source_etype=_I8), n_blocks


def splat(builder, scalar, ty):  # type: ignore[no-untyped-def]
    """`scalar` in every lane of the vector type `ty`."""
    v = builder.insert_element(ir.Constant(ty, None), scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, ty.count), None))


def hsum(builder, v):  # type: ignore[no-untyped-def]
    """The sum of a vector's lanes (a power of two of them): halve and add."""
    n = v.type.count
    width = n // 2
    while width:
        v = builder.fadd(v, builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n),
                                                                         [(j + width) % n for j in range(n)])))
        width //= 2
    return builder.extract_element(v, ir.Constant(_I32, 0))


def in_pairs(builder, n, block):  # type: ignore[no-untyped-def]
    """block(k, j) for k = 0 .. n - 1 (an i64 count), even k on accumulator chain j = 0 and odd k on
    chain 1: two multiply-add chains in flight, not one."""
    two = ir.Constant(_I64, 2)
    with cgutils.for_range(builder, builder.sdiv(n, two)) as loop:
        block(builder.mul(loop.index, two), 0)
        block(builder.add(builder.mul(loop.index, two), ir.Constant(_I64, 1)), 1)
    with builder.if_then(builder.icmp_signed("!=", builder.srem(n, two), ir.Constant(_I64, 0))):
        block(builder.sub(n, ir.Constant(_I64, 1)), 0)
