"""Decode's matvec on repacked weights (repack.py: int8 q, a float32 scale and offset per group),
two rows at a time with their accumulators in registers.

repack.matmul's one-activation path (`_dot_g32` & co.) keeps its 32 partial sums in a numba array:
LLVM cannot keep an array in registers, so every block's multiply-adds wait on a store and a reload
of the same array (~8 cycles per 32 weights, measured 72 us for SmolLM2's 1536 x 576 gate in L2).
Here the kernel is LLVM IR (a numba intrinsic, as argmax.py's) whose accumulators are SSA values,
and the scale leaves the inner loop:

  w . x = sum_k s_k (q_k . x_k) + sum_k m_k (sum_i x_k,i)      (k: a group of 32 or 16 weights)

so per 16 weights one int8 -> float32 conversion and one multiply-add; per group one more
multiply-add for the scale, and the offsets (Q4_1, Q4_K, ...) one scalar multiply-add with the
activation's group sums, computed once per call. Float32 throughout, in another order than the
array kernels' (rounding differs in the last bits; a dot product is a sum in any order).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

from larql.quant.ir_parts import hsum, in_pairs, ir_row, splat

AHEAD = 4  # rows ahead to prefetch
_I8, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
_V16I8, _V16I32, _V16F32 = ir.VectorType(_I8, 16), ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)


def _make(group: int, offset: bool):  # type: ignore[no-untyped-def]
    """The intrinsic for one (group size, offset or not): row r of q `[rows, cols]` times x into out[r]."""
    step = 32  # bytes per 32 weights

    @intrinsic
    def row(typingctx, q, scale, off, x, xsum, r, out):  # type: ignore[no-untyped-def]
        sig = types.void(q, scale, off, x, xsum, r, out)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            a = signature.args
            xa, ua, oo = (context.make_array(a[i])(context, builder, args[i]).data for i in (3, 4, 6))
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16F32, [_V16F32] * 3),
                                                 "llvm.fma.v16f32")
            fma1 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32] * 3), "llvm.fma.f32")
            qrow, nb = ir_row(context, builder, a[0], args[0], args[5], step)
            ahead = ir_row(context, builder, a[0], args[0], builder.add(args[5], ir.Constant(_I64, AHEAD)), step)[0]
            prefetch = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [
                ir.PointerType(_I8), _I32, _I32, _I32]), "llvm.prefetch")
            srow = ir_row(context, builder, a[1], args[1], args[5], 4)[0]
            orow = ir_row(context, builder, a[2], args[2], args[5], 4)[0]
            # even and odd groups go to different accumulators: two multiply-add chains, not one
            acc = [cgutils.alloca_once_value(builder, ir.Constant(_V16F32, None)) for _ in range(2)]
            macc = [cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0)) for _ in range(2)]

            def at(base, k, size, step_, plus=0):  # type: ignore[no-untyped-def]
                off_ = builder.add(builder.mul(k, ir.Constant(_I64, step_)), ir.Constant(_I64, plus))
                return builder.gep(base, [off_], source_etype=size)

            def weights(k):  # type: ignore[no-untyped-def]
                """Group k's 32 int8 weights (bytes 32k .. 32k+31 of the row) as two float32 vectors,
                its scale(s) and offset."""
                qf = [builder.sitofp(builder.sext(builder.load(at(qrow, k, _I8, 32, 16 * h), typ=_V16I8, align=1),
                                                  _V16I32), _V16F32) for h in range(2)]
                ss = [builder.load(at(srow, k, _I8, 4 * (32 // group), 4 * h), typ=_F32) for h in range(32 // group)]
                return qf, ss, builder.load(at(orow, k, _I8, 4), typ=_F32) if offset else None

            def block(k, j):  # type: ignore[no-untyped-def]
                # the row AHEAD rows on: a matrix of a few hundred KB ends before the hardware's
                # prefetcher has ramped up, and its rows are the next calls' work
                builder.call(prefetch, [builder.bitcast(at(ahead, k, _I8, step), ir.PointerType(_I8)),
                                        ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
                xs = [builder.load(at(xa, k, _F32, 32, 16 * h), typ=_V16F32, align=4) for h in range(2)]
                qf, ss, m = weights(k)
                v = builder.load(acc[j])
                if group == 32:  # one scale: acc += s (q . x)
                    t = builder.call(fma, [qf[1], xs[1], builder.fmul(qf[0], xs[0])])
                    v = builder.call(fma, [t, splat(builder, ss[0], _V16F32), v])
                else:  # 16-groups: weights 0-15 take scale 2k, 16-31 scale 2k + 1
                    for h in range(2):
                        v = builder.call(fma, [builder.fmul(qf[h], xs[h]), splat(builder, ss[h], _V16F32), v])
                builder.store(v, acc[j])
                if m is not None:
                    u = builder.load(at(ua, k, _F32, 1), typ=_F32)
                    builder.store(builder.call(fma1, [m, u, builder.load(macc[j])]), macc[j])

            in_pairs(builder, nb, block)
            v = builder.fadd(builder.load(acc[0]), builder.load(acc[1]))
            total = builder.fadd(hsum(builder, v), builder.fadd(builder.load(macc[0]), builder.load(macc[1])))
            builder.store(total, builder.gep(oo, [args[5]], source_etype=_F32))
            return context.get_dummy_value()

        return sig, codegen

    return row


_G32, _G32_OFF, _G16 = _make(32, False), _make(32, True), _make(16, False)


@njit(cache=True)
def _group_sums(x: NDArray[np.float32], xsum: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """xsum[k] = the sum of x's group k of 32 (what the offsets multiply)."""
    for k in range(xsum.shape[0]):
        t = np.float32(0.0)
        for i in range(32):
            t += x[32 * k + i]
        xsum[k] = t


@njit(cache=True, parallel=True)
def matvec_g32(q: NDArray[np.int8], scale: NDArray[np.float32], x: NDArray[np.float32],
               out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = sum_k scale[r, k] (q[r, 32k:32k+32] . x[32k:32k+32])."""
    for r in prange(q.shape[0]):
        _G32(q, scale, scale, x, x, r, out)


@njit(cache=True, parallel=True)
def matvec_g32_offset(q: NDArray[np.int8], scale: NDArray[np.float32], offset: NDArray[np.float32],
                      x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = sum_k scale[r, k] (q[r, 32k:32k+32] . x[32k:..]) + offset[r, k] sum(x[32k:32k+32])."""
    xsum = np.empty(q.shape[1] // 32, dtype=np.float32)
    _group_sums(x, xsum)
    for r in prange(q.shape[0]):
        _G32_OFF(q, scale, offset, x, xsum, r, out)


@njit(cache=True, parallel=True)
def matvec_g16(q: NDArray[np.int8], scale: NDArray[np.float32], x: NDArray[np.float32],
               out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = sum_g scale[r, g] (q[r, 16g:16g+16] . x[16g:16g+16])."""
    for r in prange(q.shape[0]):
        _G16(q, scale, scale, x, x, r, out)

