"""The gate KNN's numba kernels (knn.py): int8 rows with their error terms, the bounded int8 pass
(int8 x int16 with AVX-512 VNNI's vpdpwssd or AVX2's vpmaddwd — the same int32 sums — or int8 x
float32 on the float32 tier), exact rescoring of f16 rows. A module of its own so that opening a
vindex loads no numba."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

from larql.quant.argmax import ir_add_scaled, ir_row, ir_sum8
from larql.quant.isa import TIER

__all__ = ["TIER", "avx2_bounds", "int8_bounds", "quantize_query", "quantize_rows", "rescore_f16", "vnni_bounds"]

_BLOCKS = 64  # row blocks per pass (numba's threads take them in turn)
_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_V32I8, _V16I16 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16)
_V8I32, _V8F32 = ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)


@njit(cache=True, parallel=True)
def quantize_rows(g: NDArray[np.float32], codes: NDArray[np.int8], scales: NDArray[np.float32],
                   err: NDArray[np.float64], absmax: NDArray[np.float64],
                   gnorm: NDArray[np.float64]) -> None:  # pragma: no cover - numba
    """Each row as codes * scale (scale = max |g| / 127, rounded to nearest); err, absmax and gnorm
    in float64, where codes * scale and g - codes * scale are exact. codes may be wider than g (its
    row padded to a multiple of 32 for the VNNI pass): the columns past g's are left as they are."""
    n, h = g.shape
    for f in prange(n):
        m = np.float32(0.0)
        for j in range(h):
            m = max(m, abs(g[f, j]))
        sc = m / np.float32(127.0) if m > 0 else np.float32(1.0)
        e, top, c2 = 0.0, 0.0, 0.0
        for j in range(h):
            c = min(127.0, max(-127.0, np.rint(g[f, j] / sc)))
            codes[f, j] = np.int8(c)
            d = np.float64(g[f, j]) - c * np.float64(sc)
            e += d * d
            top = max(top, abs(c) * np.float64(sc))
            c2 += c * c
        scales[f], err[f], absmax[f] = sc, np.sqrt(e) * (1.0 + 1e-12), top  # never below the true norm
        gnorm[f] = np.sqrt(c2) * np.float64(sc) * (1.0 + 1e-12)  # ||codes * scale||, rounded up


@njit(cache=True, parallel=True, fastmath=True)
def int8_bounds(codes: NDArray[np.int8], scales: NDArray[np.float32], err: NDArray[np.float64],
                 absmax: NDArray[np.float64], q: NDArray[np.float32], q_l2: float, slack: float,
                 lo: NDArray[np.float64], hi: NDArray[np.float64]) -> None:  # pragma: no cover - numba
    """lo[f], hi[f]: |approx| -/+ the bound, approx = scales[f] * sum_j codes[f, j] * q[j] (float32,
    summed in any order), bound = err[f] * q_l2 + absmax[f] * slack."""
    n, h = codes.shape
    per = (n + _BLOCKS - 1) // _BLOCKS
    for b in prange(_BLOCKS):
        for f in range(b * per, min(n, (b + 1) * per)):
            s = np.float32(0.0)
            for j in range(h):
                s += np.float32(codes[f, j]) * q[j]
            mag = abs(np.float64(s * scales[f]))
            bound = err[f] * q_l2 + absmax[f] * slack
            lo[f], hi[f] = mag - bound, mag + bound


def _row_dot_i16(vnni: bool):  # type: ignore[no-untyped-def]
    """The intrinsic sum_k dq[k] * (the int32 dot of block k (32 columns) of int8 codes row r with
    the int16 query q16's block k), float32: 4 x 8 lanes, each summing every 4th block's int32 dots
    times dq[k] (the remainder into the first 8), then the 32 added.

    A block's 32 codes are sign-extended to two 16 x int16 vectors and multiplied by the query's in
    pairs of int16 products added to an int32 lane: vpdpwssd (AVX-512 VNNI) accumulates them, or
    vpmaddwd then vpaddd (AVX2: the same sums, as no product pair reaches 2^31). A lane holds 4
    products, |.| <= 4 * 127 * 32639 < 2^24, exact in int32 and in float32.
    """
    def dot(typingctx, codes, r, q16, dq):  # type: ignore[no-untyped-def]
        return types.float32(codes, r, q16, dq), codegen

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        c_v, r_v, q_v, d_v = args
        qa = context.make_array(signature.args[2])(context, builder, q_v)
        da = context.make_array(signature.args[3])(context, builder, d_v)
        row, n_blocks = ir_row(context, builder, signature.args[0], c_v, r_v, 32)
        if vnni:
            fnty = ir.FunctionType(_V8I32, [_V8I32, _V16I16, _V16I16])
            dpwssd = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpwssd.256")

            def pairs(acc, a, b):  # type: ignore[no-untyped-def]
                return builder.call(dpwssd, [acc, a, b])
        else:
            fnty = ir.FunctionType(_V8I32, [_V16I16, _V16I16])
            maddwd = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx2.pmadd.wd")

            def pairs(acc, a, b):  # type: ignore[no-untyped-def]
                return builder.add(acc, builder.call(maddwd, [a, b]))

        accs = [cgutils.alloca_once_value(builder, ir.Constant(_V8F32, None)) for _ in range(4)]
        first = ir.Constant(ir.VectorType(_I32, 16), list(range(16)))
        second = ir.Constant(ir.VectorType(_I32, 16), list(range(16, 32)))

        def block(k, acc):  # type: ignore[no-untyped-def]
            off = builder.mul(k, ir.Constant(_I64, 32))
            cv = builder.load(builder.gep(row, [off], source_etype=_I8), typ=_V32I8, align=1)
            qp = builder.gep(qa.data, [off], source_etype=_I16)
            q_lo = builder.load(qp, typ=_V16I16, align=2)
            q_hi = builder.load(builder.gep(qp, [ir.Constant(_I64, 16)], source_etype=_I16), typ=_V16I16, align=2)
            s = pairs(ir.Constant(_V8I32, None), builder.sext(builder.shuffle_vector(cv, cv, first), _V16I16), q_lo)
            s = pairs(s, builder.sext(builder.shuffle_vector(cv, cv, second), _V16I16), q_hi)
            ir_add_scaled(builder, acc, s, builder.load(builder.gep(da.data, [k], source_etype=_F32), typ=_F32))

        # four accumulators, independent chains: blocks 4g + i into the i-th, the rest into the first
        groups = builder.sdiv(n_blocks, ir.Constant(_I64, 4))
        with cgutils.for_range(builder, groups) as loop:
            for i in range(4):
                block(builder.add(builder.mul(loop.index, ir.Constant(_I64, 4)), ir.Constant(_I64, i)), accs[i])
        done = builder.mul(groups, ir.Constant(_I64, 4))
        with cgutils.for_range(builder, builder.sub(n_blocks, done)) as loop:
            block(builder.add(done, loop.index), accs[0])
        a = [builder.load(x) for x in accs]
        return ir_sum8(builder, builder.fadd(builder.fadd(a[0], a[1]), builder.fadd(a[2], a[3])))

    return intrinsic(dot)


# one intrinsic and one kernel per tier: numba's cache never serves one tier's code to the other,
# and the VNNI instruction is compiled only where it is called
_i8_row_dot_i16 = _row_dot_i16(vnni=True)
_i8_row_dot_i16_avx2 = _row_dot_i16(vnni=False)


@njit(cache=True)
def quantize_query(q: NDArray[np.float32], q16: NDArray[np.int16],
                   dq: NDArray[np.float32]) -> tuple[float, float]:  # pragma: no cover - numba
    """The query q (length a multiple of 32) in two int8 digits per value, as one int16: per 32
    values d = max|q_block| / 127, q1 = round(q / d) and q2 = round((q - q1 d) / (d / 256)), both
    in -127..127, q16 = 256 q1 + q2 and dq[k] = d / 256; so q^ = q16 * dq, off q by ~d/512 per value
    (one int8 digit: d/2). Returns (||q - q^||, ||q^||) in float64, from q^ as stored (products
    exact in float64), whatever rounding formed the codes."""
    err2, hat2 = 0.0, 0.0
    for k in range(q.shape[0] // 32):
        top = np.float32(0.0)
        for i in range(32):
            top = max(top, abs(q[32 * k + i]))
        d = top / np.float32(127.0)
        d2 = d * np.float32(1.0 / 256.0)
        dq[k] = d2
        inv = 1.0 / np.float64(d) if d > 0 else 0.0
        inv2 = 1.0 / np.float64(d2) if d2 > 0 else 0.0
        for i in range(32 * k, 32 * k + 32):
            x = np.float64(q[i])
            c1 = min(max(np.round(x * inv), -127.0), 127.0)
            c2 = min(max(np.round((x - c1 * np.float64(d)) * inv2), -127.0), 127.0)
            q16[i] = np.int16(256.0 * c1 + c2)
            hat = (256.0 * c1 + c2) * np.float64(d2)
            err2 += (hat - x) ** 2
            hat2 += hat * hat
    return np.sqrt(err2), np.sqrt(hat2)


@njit(cache=True, parallel=True)
def vnni_bounds(codes: NDArray[np.int8], scales: NDArray[np.float32], err: NDArray[np.float64],
                gnorm: NDArray[np.float64], q16: NDArray[np.int16], dq: NDArray[np.float32], q_l2: float,
                q_term: float, slack: float, tiny: float, lo: NDArray[np.float64],
                hi: NDArray[np.float64]) -> None:  # pragma: no cover - numba
    """lo[f], hi[f]: |approx| -/+ the bound, approx = scales[f] * _i8_row_dot_i16(row f) (the
    product in float64, exact), bound = (err[f] * q_l2 + gnorm[f] * q_term + (gnorm[f] + err[f])
    * slack + scales[f] * tiny) * (1 + 1e-9) (knn.approx_bounds)."""
    n = codes.shape[0]
    per = (n + _BLOCKS - 1) // _BLOCKS
    for b in prange(_BLOCKS):
        for f in range(b * per, min(n, (b + 1) * per)):
            s = _i8_row_dot_i16(codes, f, q16, dq)
            mag = abs(np.float64(s) * np.float64(scales[f]))
            bound = (err[f] * q_l2 + gnorm[f] * q_term + (gnorm[f] + err[f]) * slack
                     + np.float64(scales[f]) * tiny) * (1.0 + 1e-9)
            lo[f], hi[f] = mag - bound, mag + bound


@njit(cache=True, parallel=True)
def avx2_bounds(codes: NDArray[np.int8], scales: NDArray[np.float32], err: NDArray[np.float64],
                gnorm: NDArray[np.float64], q16: NDArray[np.int16], dq: NDArray[np.float32], q_l2: float,
                q_term: float, slack: float, tiny: float, lo: NDArray[np.float64],
                hi: NDArray[np.float64]) -> None:  # pragma: no cover - numba
    """vnni_bounds on the AVX2 tier: the same int32 sums (vpmaddwd + vpaddd), so the same lo and hi."""
    n = codes.shape[0]
    per = (n + _BLOCKS - 1) // _BLOCKS
    for b in prange(_BLOCKS):
        for f in range(b * per, min(n, (b + 1) * per)):
            s = _i8_row_dot_i16_avx2(codes, f, q16, dq)
            mag = abs(np.float64(s) * np.float64(scales[f]))
            bound = (err[f] * q_l2 + gnorm[f] * q_term + (gnorm[f] + err[f]) * slack
                     + np.float64(scales[f]) * tiny) * (1.0 + 1e-9)
            lo[f], hi[f] = mag - bound, mag + bound


@njit(cache=True, parallel=True, fastmath=True)
def rescore_f16(bits: NDArray[np.uint16], cand: NDArray[np.int64], q: NDArray[np.float32],
                 out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[i] = gate row cand[i] . q in float32, the f16 row read from its bits (numba has no
    float16): sign and the 15 other bits moved to float32's place read 2^-112 times the value, for
    normal and subnormal halves alike, and 2^112 puts it back exactly."""
    h = bits.shape[1]
    blocks = min(len(cand), 8)
    per = (len(cand) + blocks - 1) // max(blocks, 1)
    for b in prange(blocks):
        buf = np.empty(h, np.uint32)
        fb = buf.view(np.float32)
        for i in range(b * per, min(len(cand), (b + 1) * per)):
            row = bits[cand[i]]
            for j in range(h):
                x = np.uint32(row[j])
                buf[j] = ((x & np.uint32(0x8000)) << np.uint32(16)) | ((x & np.uint32(0x7FFF)) << np.uint32(13))
            s = np.float32(0.0)
            for j in range(h):
                s += (fb[j] * np.float32(2.0 ** 112)) * q[j]
            out[i] = s
