"""The float32 matvec over raw Q8_0 rows, with its accumulators in registers: the full lm_head of a
prefill's last position (Gemma 3's 262,144 x 640 Q8_0 tied embedding, 178 MB) and argmax.py's exact
rescoring of the candidate rows.

dot_kernels.py's `_dot_q8_0` keeps its 32 partial sums in a numba array, which LLVM cannot hold in
registers: every block's multiply-adds wait on a store and a reload of that array, and the lm_head
took ~12 ms on one core as on two (the loop, not the memory, set the pace). Here the row loop is
LLVM IR (a numba intrinsic, as matvec_rows.py's and argmax.py's), the accumulators are SSA values,
and the block's scale leaves the inner products:

  w . x = sum_k d_k (q_k . x_k)          (k: a block of 32 weights, d_k its f16 scale)

per 16 weights one int8 -> float32 conversion and one multiply-add, per block one more multiply-add.
Float32 throughout, in another order than `_dot_q8_0` (the last bits differ; within argmax.py's
rounding bound c = 1.01 (n + 2) 2^-24, which holds for a dot product summed in any order).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

from larql.quant.ir_parts import hsum, in_pairs, ir_row, splat

_I8, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
_V16I8, _V16I32, _V16F32 = ir.VectorType(_I8, 16), ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)


@intrinsic
def row_dot(typingctx, w, r, x, out):  # type: ignore[no-untyped-def]
    """out[r] = row r of the Q8_0 bytes w `[rows, 34 * blocks]` times x `[32 * blocks]`.

    A Q8_0 block, 34 bytes:
      byte 0-1  d (f16, little-endian)  | bytes 2 .. 33  q_0 .. q_31 (int8)    weight i = d * q_i
    The f16 is widened by `fpext half` (exact, as kernels.F16_TO_F32's table); q_0..15 and
    q_16..31 are two 16-byte loads, sign-extended and converted to float32.
    """
    if x.layout != "C" or out.layout != "C":  # x is read as one block of float32, out written at r
        return None
    sig = types.void(w, r, x, out)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        a = signature.args
        xa = context.make_array(a[2])(context, builder, args[2]).data
        oo = context.make_array(a[3])(context, builder, args[3]).data
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16F32, [_V16F32] * 3), "llvm.fma.v16f32")
        row, nb = ir_row(context, builder, a[0], args[0], args[1], 34)
        # even and odd blocks go to different accumulators: two multiply-add chains, not one
        acc = [cgutils.alloca_once_value(builder, ir.Constant(_V16F32, None)) for _ in range(2)]

        def block(k, j):  # type: ignore[no-untyped-def]
            base = builder.gep(row, [builder.mul(k, ir.Constant(_I64, 34))], source_etype=_I8)
            d = builder.fpext(builder.load(base, typ=ir.HalfType(), align=1), _F32)
            qf = [builder.sitofp(builder.sext(builder.load(
                builder.gep(base, [ir.Constant(_I64, 2 + 16 * h)], source_etype=_I8), typ=_V16I8, align=1), _V16I32),
                _V16F32) for h in range(2)]
            xo = builder.mul(k, ir.Constant(_I64, 32))
            xs = [builder.load(builder.gep(xa, [builder.add(xo, ir.Constant(_I64, 16 * h))], source_etype=_F32),
                               typ=_V16F32, align=4) for h in range(2)]
            t = builder.call(fma, [qf[1], xs[1], builder.fmul(qf[0], xs[0])])  # q_k . x_k, lane-wise
            builder.store(builder.call(fma, [t, splat(builder, d, _V16F32), builder.load(acc[j])]), acc[j])

        in_pairs(builder, nb, block)
        total = hsum(builder, builder.fadd(builder.load(acc[0]), builder.load(acc[1])))
        builder.store(total, builder.gep(oo, [args[1]], source_etype=_F32))
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, parallel=True)
def matvec_q8_0(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = sum_k d_k (q_k . x_k) over row r's Q8_0 blocks; w `[rows, 34 * blocks]` (rows
    contiguous), x `[32 * blocks]` and out `[rows]` float32, contiguous."""
    for r in prange(w.shape[0]):
        row_dot(w, r, x, out)  # type: ignore[call-arg]
