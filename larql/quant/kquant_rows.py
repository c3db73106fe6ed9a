"""Decode's matvec straight from the GGUF blocks of the k-quants (Q4_K, Q5_K, Q6_K), Q4_0 and Q5_0, with
no repacked copy: the same register-accumulator form as matvec_rows.py's kernels over int8 copies,
the bits unpacked in vector registers on the way.

Per 32 weights of one scale (16 for Q6_K) the row kernel forms the float32 dot product q . x of the
small integers q with the activation (two 16-lane conversions and multiply-adds), then adds it times
the group's scale into a 16-lane accumulator; the k-quants' offsets leave the inner loop:

  w . x = sum_s d sc_s (q_s . x_s) - sum_s dmin m_s (sum_i x_s,i)      (s: a sub-block of 32 weights)

with the activation's sums per 32 computed once per call and shared by all rows (as matvec_rows'
offsets). Float32 throughout, in another order than the exact dequantization (the last bits differ:
a dot product summed in another order). Every load is of contiguous bytes; every shift is by a
constant, so the unpacking vectorizes on AVX2 as on AVX-512.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

from larql.quant.ir_parts import hsum, in_pairs, ir_row, splat
from larql.quant.types import GGMLType

_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_V16I8, _V16I32, _V16F32 = ir.VectorType(_I8, 16), ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)
_V8I8, _V8I32, _V8F32 = ir.VectorType(_I8, 8), ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)
_V2I32, _V32I8, _V64I8 = ir.VectorType(_I32, 2), ir.VectorType(_I8, 32), ir.VectorType(_I8, 64)
_V16I16, _V64I16 = ir.VectorType(_I16, 16), ir.VectorType(_I16, 64)
AHEAD = 4  # rows ahead to prefetch (matvec_rows.py's reason: small matrices end before the prefetcher ramps up)


class _Block:
    """What a block's codegen needs: the builder, the block's first byte, the activation's pointer
    at the block's first weight, the sums of 32, and the multiply-add intrinsics."""

    def __init__(self, builder, fma, fma8, base, x, xsum, slots):  # type: ignore[no-untyped-def]
        self.b, self.fma, self.fma8, self.base, self.x, self.xsum = builder, fma, fma8, base, x, xsum
        self.slots = slots  # 16 floats on the stack (spill / scalar)

    def spill(self, v):  # type: ignore[no-untyped-def]
        """Store a vector of up to 16 floats for `scalar` to read lane by lane: a broadcast from memory
        is one instruction where extracting a lane and splatting it is two or three."""
        self.b.store(v, self.b.bitcast(self.slots, ir.PointerType(v.type)))

    def scalar(self, i: int):  # type: ignore[no-untyped-def]
        return self.b.load(self.b.gep(self.slots, [ir.Constant(_I64, i)], source_etype=_F32), typ=_F32)

    def byte(self, off: int):  # type: ignore[no-untyped-def]
        return self.b.gep(self.base, [ir.Constant(_I64, off)], source_etype=_I8)

    def load(self, off: int, ty):  # type: ignore[no-untyped-def]
        return self.b.load(self.b.bitcast(self.byte(off), ir.PointerType(ty)), typ=ty, align=1)

    def half(self, off: int):  # type: ignore[no-untyped-def]
        """The f16 at byte off, widened to float32 (exact, as kernels.F16_TO_F32's table)."""
        return self.b.fpext(self.load(off, ir.HalfType()), _F32)

    def xs(self, i: int):  # type: ignore[no-untyped-def]
        """The 16 activations from the block's weight i."""
        p = self.b.gep(self.x, [ir.Constant(_I64, i)], source_etype=_F32)
        return self.b.load(self.b.bitcast(p, ir.PointerType(_V16F32)), typ=_V16F32, align=4)

    def floats(self, q, signed: bool):  # type: ignore[no-untyped-def]
        """16 small integers (i8 lanes) as float32 (sign- or zero-extended, then the signed conversion
        x86 has: an unsigned one costs AVX2 several instructions)."""
        wide = self.b.sext(q, _V16I32) if signed else self.b.zext(q, _V16I32)
        return self.b.sitofp(wide, _V16F32)

    def dot32(self, q0, q1, i: int, signed: bool):  # type: ignore[no-untyped-def]
        """Lane-wise q . x of 32 weights (two 16-lane i8 vectors) from the block's weight i."""
        t = self.b.fmul(self.floats(q0, signed), self.xs(i))
        return self.b.call(self.fma, [self.floats(q1, signed), self.xs(i + 16), t])


def _bytes16(value: int):  # type: ignore[no-untyped-def]
    return ir.Constant(_V16I8, [value] * 16)


def _bytes(n: int, value: int):  # type: ignore[no-untyped-def]
    return ir.Constant(ir.VectorType(_I8, n), [value] * n)


def _concat(b, lo, hi):  # type: ignore[no-untyped-def]
    """Two byte vectors of n lanes as one of 2n."""
    n = lo.type.count
    return b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 2 * n), list(range(2 * n))))


def _move_bits(b, v, src: int, dst: int, mask: int, n: int = 16):  # type: ignore[no-untyped-def]
    """The bits of each of the n bytes of v from bit src on moved to bit dst on, kept where `mask`
    has them: one constant shift and an and."""
    moved = b.shl(v, _bytes(n, dst - src)) if dst >= src else b.lshr(v, _bytes(n, src - dst))
    return b.and_(moved, _bytes(n, mask))


def _row_kernel(block_bytes: int, block_weights: int, emit: Callable[..., None]):  # type: ignore[no-untyped-def]
    """An intrinsic row(w, r, x, xsum, out): out[r] = row r of the blocks w `[rows, bytes]` times x,
    each block's codegen by emit(blk, acc, macc) where acc is the block's two 16-lane accumulators
    (read and written through `acc[i]` slots) and macc its 8-lane one for the offsets."""

    @intrinsic
    def row(typingctx, w, r, x, xsum, out):  # type: ignore[no-untyped-def]
        if x.layout != "C" or xsum.layout != "C" or out.layout != "C":
            return None
        sig = types.void(w, r, x, xsum, out)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            a = signature.args
            xa, ua, oo = (context.make_array(a[i])(context, builder, args[i]).data for i in (2, 3, 4))
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16F32, [_V16F32] * 3),
                                                 "llvm.fma.v16f32")
            fma8 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8F32, [_V8F32] * 3),
                                                  "llvm.fma.v8f32")
            prefetch = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [
                ir.PointerType(_I8), _I32, _I32, _I32]), "llvm.prefetch")
            rowp, nb = ir_row(context, builder, a[0], args[0], args[1], block_bytes)
            ahead = ir_row(context, builder, a[0], args[0], builder.add(args[1], ir.Constant(_I64, AHEAD)),
                           block_bytes)[0]
            # blocks alternate between two sets of accumulators, and within a block two more: four
            # multiply-add chains in flight
            acc = [[cgutils.alloca_once_value(builder, ir.Constant(_V16F32, None)) for _ in range(2)]
                   for _ in range(2)]
            macc = [cgutils.alloca_once_value(builder, ir.Constant(_V8F32, None)) for _ in range(2)]
            slots = builder.bitcast(cgutils.alloca_once(builder, _V16F32), ir.PointerType(_F32))

            def block(k, j):  # type: ignore[no-untyped-def]
                off = builder.mul(k, ir.Constant(_I64, block_bytes))
                # the row AHEAD rows on: a line per 64 bytes (small blocks: every other block, one line)
                for line in (range(0, block_bytes, 64) if block_bytes >= 64 else range(0 if j == 0 else 64, 1)):
                    p = builder.gep(ahead, [builder.add(off, ir.Constant(_I64, line))], source_etype=_I8)
                    builder.call(prefetch, [p, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
                base = builder.gep(rowp, [off], source_etype=_I8)
                x = builder.gep(xa, [builder.mul(k, ir.Constant(_I64, block_weights))], source_etype=_F32)
                xsum = builder.gep(ua, [builder.mul(k, ir.Constant(_I64, block_weights // 32))],
                                   source_etype=_F32)
                blk = _Block(builder, fma, fma8, base, x, xsum, slots)
                emit(blk, acc[j], macc[j])

            in_pairs(builder, nb, block)
            v = builder.fadd(builder.fadd(builder.load(acc[0][0]), builder.load(acc[0][1])),
                             builder.fadd(builder.load(acc[1][0]), builder.load(acc[1][1])))
            m = builder.fadd(builder.load(macc[0]), builder.load(macc[1]))
            total = builder.fsub(hsum(builder, v), hsum(builder, m))
            builder.store(total, builder.gep(oo, [args[1]], source_etype=_F32))
            return context.get_dummy_value()

        return sig, codegen

    return row


def _add_scaled(blk, slot, dot, scale):  # type: ignore[no-untyped-def]
    """slot += dot * scale (scale a float32 scalar, in every lane)."""
    b = blk.b
    b.store(b.call(blk.fma, [dot, splat(b, scale, _V16F32), b.load(slot)]), slot)


def _k_scales(blk, d, dmin):  # type: ignore[no-untyped-def]
    """Q4_K / Q5_K: (d sc_s, dmin m_s) for s = 0..7 as two 8-lane float32 vectors, from bytes 4-15.
    The 12 scale bytes as three little-endian words a, b, c (bits as reference.py's diagram):
      sc 0-3 = a & 0x3f..,  m 0-3 = b & 0x3f..
      sc 4-7 = c & 0x0f.. | (a >> 2) & 0x30..,  m 4-7 = (c >> 4) & 0x0f.. | (b >> 2) & 0x30..
    each word four 6-bit values, one a byte."""
    bld = blk.b
    a, b, c = (blk.load(4 + 4 * i, _I32) for i in range(3))

    def k(v: int):  # type: ignore[no-untyped-def]
        return ir.Constant(_I32, v)

    sc_lo, mn_lo = bld.and_(a, k(0x3F3F3F3F)), bld.and_(b, k(0x3F3F3F3F))
    sc_hi = bld.or_(bld.and_(c, k(0x0F0F0F0F)), bld.and_(bld.lshr(a, k(2)), k(0x30303030)))
    mn_hi = bld.or_(bld.and_(bld.lshr(c, k(4)), k(0x0F0F0F0F)), bld.and_(bld.lshr(b, k(2)), k(0x30303030)))

    def floats(lo, hi, f):  # type: ignore[no-untyped-def]
        v = bld.insert_element(bld.insert_element(ir.Constant(_V2I32, None), lo, k(0)), hi, k(1))
        q = bld.sitofp(bld.zext(bld.bitcast(v, _V8I8), _V8I32), _V8F32)
        return bld.fmul(q, splat(bld, f, _V8F32))

    return floats(sc_lo, sc_hi, d), floats(mn_lo, mn_hi, dmin)


def _emit_k(five: bool):  # type: ignore[no-untyped-def]
    """Q4_K (144 bytes) and Q5_K (176 bytes), 256 weights in 8 sub-blocks of 32.
       Q4_K: byte 0-1 d | 2-3 dmin | 4-15 scales | 16-143 qs
       Q5_K: byte 0-1 d | 2-3 dmin | 4-15 scales | 16-47 qh | 48-175 qs
    qs chunk c (32 bytes) holds sub-block 2c in its low nibbles and 2c+1 in its high nibbles,
    weights in order; Q5_K's qh[i] bit s is the fifth bit of weight 32s + i."""
    qs0 = 48 if five else 16

    def emit(blk, acc, macc):  # type: ignore[no-untyped-def]
        b = blk.b
        scales, mins = _k_scales(blk, blk.half(0), blk.half(2))
        xsum = b.load(b.bitcast(blk.xsum, ir.PointerType(_V8F32)), typ=_V8F32, align=4)
        b.store(b.call(blk.fma8, [mins, xsum, b.load(macc)]), macc)
        qh = [blk.load(16 + 16 * h, _V16I8) for h in range(2)] if five else None
        for c in range(4):
            qs = [blk.load(qs0 + 32 * c + 16 * h, _V16I8) for h in range(2)]
            for nib in range(2):
                s = 2 * c + nib
                q = [b.and_(v, _bytes16(15)) if nib == 0 else b.lshr(v, _bytes16(4)) for v in qs]
                if qh is not None:  # bit s of qh -> bit 4 of the weight
                    hi = [_move_bits(b, v, s, 4, 16) for v in qh]
                    q = [b.or_(q[h], hi[h]) for h in range(2)]
                dot = blk.dot32(q[0], q[1], 32 * s, signed=False)
                _add_scaled(blk, acc[s % 2], dot, b.extract_element(scales, ir.Constant(_I32, s)))

    return emit


def _emit_q6_k(blk, acc, macc):  # type: ignore[no-untyped-def]
    """Q6_K, 256 weights in 210 bytes, w = (d sc[e // 16]) (q - 32), q 6 bits (reference.py):
       byte 0-127 ql (low 4 bits) | 128-191 qh (high 2 bits) | 192-207 sc (int8) | 208-209 d (f16)
    Weight e = 128h + 32t + c: low = ql[64h + 32(t % 2) + c] >> 4(t // 2) & 15, high = qh[32h + c] >> 2t & 3.
    Per half h the 64 ql bytes give t = 0, 1 in their low nibbles and t = 2, 3 in their high ones, and
    the high bits of t are qh's bits 2t, 2t+1 moved to bits 4, 5: so the integers of 64 weights at a
    time come from a few 64-byte operations. Each is multiplied by its int8 scale as a 16-bit integer
    (exact: |(q - 32) sc| <= 4096), so the block's sum takes d once: d sum_e ((q_e - 32) sc_e) x_e."""
    b = blk.b
    sc = b.sext(blk.load(192, _V16I8), _V16I16)
    block = [None, None]
    for h in range(2):
        ql = blk.load(64 * h, _V64I8)
        qh = blk.load(128 + 32 * h, _V32I8)
        for pair in range(2):  # t = 2 pair, 2 pair + 1
            low = b.and_(ql, _bytes(64, 15)) if pair == 0 else b.lshr(ql, _bytes(64, 4))
            high = _concat(b, *(_move_bits(b, qh, 2 * t, 4, 48, 32) for t in (2 * pair, 2 * pair + 1)))
            q = b.sext(b.sub(b.or_(low, high), _bytes(64, 32)), _V64I16)
            first = 8 * h + 4 * pair  # the scale of the first 16 of these 64 weights
            scales = b.shuffle_vector(sc, sc, ir.Constant(ir.VectorType(_I32, 64),
                                                          [first + i // 16 for i in range(64)]))
            qs = b.mul(q, scales)
            for i in range(4):  # 16 weights at a time to float32
                piece = b.shuffle_vector(qs, qs, ir.Constant(ir.VectorType(_I32, 16), list(range(16 * i, 16 * i + 16))))
                qf = b.sitofp(b.sext(piece, _V16I32), _V16F32)
                x = blk.xs(128 * h + 64 * pair + 16 * i)
                k = i % 2
                block[k] = b.fmul(qf, x) if block[k] is None else b.call(blk.fma, [qf, x, block[k]])
    d = blk.half(208)
    for k in range(2):
        _add_scaled(blk, acc[k], block[k], d)


def _emit_q4_0(blk, acc, macc):  # type: ignore[no-untyped-def]
    """Q4_0, 32 weights in 18 bytes, w = d (q - 8): byte 0-1 d (f16) | 2-17 qs, low nibble of qs[j]
    weight j, high nibble weight j + 16."""
    b = blk.b
    qs = blk.load(2, _V16I8)
    q = [b.sub(b.and_(qs, _bytes16(15)), _bytes16(8)), b.sub(b.lshr(qs, _bytes16(4)), _bytes16(8))]
    _add_scaled(blk, acc[0], blk.dot32(q[0], q[1], 0, signed=True), blk.half(0))


def _emit_q5_0(blk, acc, macc):  # type: ignore[no-untyped-def]
    """Q5_0, 32 weights in 22 bytes, w = d (q - 16), q 5 bits (reference.py):
       byte 0-1 d (f16) | 2-5 qh, a little-endian u32: bit j the fifth bit of weight j | 6-21 qs as Q4_0's
    The fifth bits by a lane-wise test of qh against 1 << j (a compare, no per-lane shift)."""
    b = blk.b
    qs = blk.load(6, _V16I8)
    qh = splat(b, blk.load(2, _I32), _V16I32)
    sixteen, zero = ir.Constant(_V16I32, [16] * 16), ir.Constant(_V16I32, [0] * 16)
    q = []
    for half in range(2):  # weights 0-15 in the low nibbles, 16-31 in the high ones
        nib = b.zext(b.and_(qs, _bytes16(15)) if half == 0 else b.lshr(qs, _bytes16(4)), _V16I32)
        bit = b.and_(qh, ir.Constant(_V16I32, [1 << (16 * half + j) for j in range(16)]))
        fifth = b.select(b.icmp_unsigned("!=", bit, zero), sixteen, zero)
        q.append(b.sitofp(b.sub(b.or_(nib, fifth), sixteen), _V16F32))
    t = b.fmul(q[0], blk.xs(0))
    _add_scaled(blk, acc[0], b.call(blk.fma, [q[1], blk.xs(16), t]), blk.half(0))


_Q4_K, _Q5_K = _row_kernel(144, 256, _emit_k(False)), _row_kernel(176, 256, _emit_k(True))
_Q6_K, _Q4_0 = _row_kernel(210, 256, _emit_q6_k), _row_kernel(18, 32, _emit_q4_0)
_Q5_0 = _row_kernel(22, 32, _emit_q5_0)


@njit(cache=True)
def _group_sums(x: NDArray[np.float32]) -> NDArray[np.float32]:  # pragma: no cover - numba
    """The sums of x's groups of 32 (what the k-quants' mins multiply), padded to whole blocks of 8."""
    n = x.shape[0] // 32
    xsum = np.zeros((n + 7) // 8 * 8, dtype=np.float32)
    for k in range(n):
        t = np.float32(0.0)
        for i in range(32):
            t += x[32 * k + i]
        xsum[k] = t
    return xsum


@njit(cache=True, parallel=True)
def matvec_q4_k(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = row r of the Q4_K blocks w `[rows, 144 * blocks]` times x `[256 * blocks]`."""
    xsum = _group_sums(x)
    for r in prange(w.shape[0]):
        _Q4_K(w, r, x, xsum, out)


@njit(cache=True, parallel=True)
def matvec_q5_k(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = row r of the Q5_K blocks w `[rows, 176 * blocks]` times x `[256 * blocks]`."""
    xsum = _group_sums(x)
    for r in prange(w.shape[0]):
        _Q5_K(w, r, x, xsum, out)


@njit(cache=True, parallel=True)
def matvec_q6_k(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = row r of the Q6_K blocks w `[rows, 210 * blocks]` times x `[256 * blocks]`."""
    for r in prange(w.shape[0]):
        _Q6_K(w, r, x, x, out)


@njit(cache=True, parallel=True)
def matvec_q5_0(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = row r of the Q5_0 blocks w `[rows, 22 * blocks]` times x `[32 * blocks]`."""
    for r in prange(w.shape[0]):
        _Q5_0(w, r, x, x, out)


@njit(cache=True, parallel=True)
def matvec_q4_0(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = row r of the Q4_0 blocks w `[rows, 18 * blocks]` times x `[32 * blocks]`."""
    for r in prange(w.shape[0]):
        _Q4_0(w, r, x, x, out)


# the direct kernel of each type that has one: kernel(w `[rows, bytes]`, x, out)
MATVEC: dict[int, Callable[[NDArray[np.uint8], NDArray[np.float32], NDArray[np.float32]], None]] = {
    int(GGMLType.Q4_K): matvec_q4_k, int(GGMLType.Q5_K): matvec_q5_k, int(GGMLType.Q6_K): matvec_q6_k,
    int(GGMLType.Q4_0): matvec_q4_0, int(GGMLType.Q5_0): matvec_q5_0}
