"""Decode's matvec straight from the GGUF blocks of the k-quants (Q4_K, Q5_K, Q6_K), Q4_0 and Q5_0, with
no repacked copy: the same register-accumulator form as matvec_rows.py's kernels over int8 copies
(the frame in block_rows.py), the bits unpacked in vector registers on the way.

The products leave the scales and offsets out of the inner loop:

  w . x = sum_s d sc_s (q_s . x_s) - sum_s dmin m_s (sum_i x_s,i)      (s: a group of weights of one scale)

with the activation's sums per 32 computed once per call and shared by all rows (as matvec_rows'
offsets). Q4_K and Q6_K load their bytes as 32-bit lanes and take each lane's 4-bit / 6-bit integers
out with constant shifts and masks, lane-wise, with no shuffles; the activation is put once per call in
the order those lanes hold the weights (LANES_Q4_K, LANES_Q6_K). Float32 throughout, in another order
than the exact dequantization (the last bits differ: a dot product summed in another order).
Every shift is by a constant, so the unpacking vectorizes on AVX2 as on AVX-512. An AVX-512 target
takes Q4_K, Q6_K and Q5_0's integers to float32 in fewer instructions (permutes, the exponent trick,
masked adds: the same floats) and long rows several a call (WIDE below): decode runs the same bits
on every tier, the `*_one` kernels being the AVX2 forms on any target.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils
from numpy.typing import NDArray

from larql.quant import isa
from larql.quant.block_rows import (
    I16,
    I32,
    V2I32,
    V8F32,
    V8I8,
    V8I32,
    V16F32,
    V16I8,
    V16I32,
    V64I8,
    add_scaled,
    bytes16,
    bytes_,
    each_row,
    i32s,
    move_bits,
    row_kernel,
)
from larql.quant.ir_parts import splat
from larql.quant.types import GGMLType


def _k_scales(blk, d, dmin):  # type: ignore[no-untyped-def]
    """Q4_K / Q5_K: (d sc_s, dmin m_s) for s = 0..7 as two 8-lane float32 vectors, from bytes 4-15.
    The 12 scale bytes as three little-endian words a, b, c (bits as reference.py's diagram):
      sc 0-3 = a & 0x3f..,  m 0-3 = b & 0x3f..
      sc 4-7 = c & 0x0f.. | (a >> 2) & 0x30..,  m 4-7 = (c >> 4) & 0x0f.. | (b >> 2) & 0x30..
    each word four 6-bit values, one a byte."""
    bld = blk.b
    a, b, c = (blk.load(4 + 4 * i, I32) for i in range(3))

    def k(v: int):  # type: ignore[no-untyped-def]
        return ir.Constant(I32, v)

    sc_lo, mn_lo = bld.and_(a, k(0x3F3F3F3F)), bld.and_(b, k(0x3F3F3F3F))
    sc_hi = bld.or_(bld.and_(c, k(0x0F0F0F0F)), bld.and_(bld.lshr(a, k(2)), k(0x30303030)))
    mn_hi = bld.or_(bld.and_(bld.lshr(c, k(4)), k(0x0F0F0F0F)), bld.and_(bld.lshr(b, k(2)), k(0x30303030)))

    def floats(lo, hi, f):  # type: ignore[no-untyped-def]
        v = bld.insert_element(bld.insert_element(ir.Constant(V2I32, None), lo, k(0)), hi, k(1))
        q = bld.sitofp(bld.zext(bld.bitcast(v, V8I8), V8I32), V8F32)
        return bld.fmul(q, splat(bld, f, V8F32))

    return floats(sc_lo, sc_hi, d), floats(mn_lo, mn_hi, dmin)


def _emit_q5_k(blk, acc, macc):  # type: ignore[no-untyped-def]
    """Q5_K, 256 weights in 176 bytes, 8 sub-blocks of 32 (reference.py):
       byte 0-1 d | 2-3 dmin | 4-15 scales | 16-47 qh | 48-175 qs
    qs chunk c (32 bytes) holds sub-block 2c in its low nibbles and 2c+1 in its high nibbles, weights
    in order; qh[i] bit s is the fifth bit of weight 32s + i: moved to bit 4 by a constant shift."""
    b = blk.b
    scales, mins = _k_scales(blk, blk.half(0), blk.half(2))
    xsum = b.load(b.bitcast(blk.xsum, ir.PointerType(V8F32)), typ=V8F32, align=4)
    b.store(b.call(blk.fma8, [mins, xsum, b.load(macc)]), macc)
    qh = [blk.load(16 + 16 * h, V16I8) for h in range(2)]
    for c in range(4):
        qs = [blk.load(48 + 32 * c + 16 * h, V16I8) for h in range(2)]
        for nib in range(2):
            s = 2 * c + nib
            q = [b.and_(v, bytes16(15)) if nib == 0 else b.lshr(v, bytes16(4)) for v in qs]
            hi = [move_bits(b, v, s, 4, 16) for v in qh]
            dot = blk.dot32(b.or_(q[0], hi[0]), b.or_(q[1], hi[1]), 32 * s, signed=False)
            add_scaled(blk, acc[s % 2], dot, b.extract_element(scales, ir.Constant(I32, s)))


def _emit_q4_0(blk, acc, macc):  # type: ignore[no-untyped-def]
    """Q4_0, 32 weights in 18 bytes, w = d (q - 8): byte 0-1 d (f16) | 2-17 qs, low nibble of qs[j]
    weight j, high nibble weight j + 16."""
    b = blk.b
    qs = blk.load(2, V16I8)
    q = [b.sub(b.and_(qs, bytes16(15)), bytes16(8)), b.sub(b.lshr(qs, bytes16(4)), bytes16(8))]
    add_scaled(blk, acc[0], blk.dot32(q[0], q[1], 0, signed=True), blk.half(0))


def _q5_0_emit(permute: bool):  # type: ignore[no-untyped-def]
    """Q5_0's block codegen; `permute` (AVX-512): each byte widened to a 32-bit lane, its low nibble's
    float32 less 16 by vpermps from the table -16..-1 (which reads only the low 4 bits), then 16 added
    where qh's bit is set (a mask register from qh's 16 bits, a masked add): q - 16 exactly, the floats
    of the conversion, in three instructions per 16 weights where the test, select, or, subtraction and
    conversion take six."""
    def emit(blk, acc, macc):  # type: ignore[no-untyped-def]
        _emit_q5_0(blk, acc, macc, permute)

    return emit


def _emit_q5_0(blk, acc, macc, permute):  # type: ignore[no-untyped-def]
    """Q5_0, 32 weights in 22 bytes, w = d (q - 16), q 5 bits (reference.py):
       byte 0-1 d (f16) | 2-5 qh, a little-endian u32: bit j the fifth bit of weight j | 6-21 qs as Q4_0's
    The fifth bits by a lane-wise test of qh against 1 << j (a compare, no per-lane shift)."""
    b = blk.b
    qs = blk.load(6, V16I8)
    q = []
    if permute:
        perm = cgutils.get_or_insert_function(b.module, ir.FunctionType(V16F32, [V16F32, V16I32]),
                                              "llvm.x86.avx512.permvar.sf.512")
        table = ir.Constant(V16F32, [float(i - 16) for i in range(16)])
        wide = b.zext(qs, V16I32)
        qh = blk.load(2, I32)
        for half in range(2):  # weights 0-15 in the low nibbles, 16-31 in the high ones
            low = b.call(perm, [table, wide if half == 0 else b.lshr(wide, i32s(4))])
            bits = b.trunc(b.lshr(qh, ir.Constant(I32, 16)) if half else qh, I16)
            mask = b.bitcast(bits, ir.VectorType(ir.IntType(1), 16))
            q.append(b.select(mask, b.fadd(low, ir.Constant(V16F32, [16.0] * 16)), low))
    else:
        qh = splat(b, blk.load(2, I32), V16I32)
        sixteen, zero = ir.Constant(V16I32, [16] * 16), ir.Constant(V16I32, [0] * 16)
        for half in range(2):
            nib = b.zext(b.and_(qs, bytes16(15)) if half == 0 else b.lshr(qs, bytes16(4)), V16I32)
            bit = b.and_(qh, ir.Constant(V16I32, [1 << (16 * half + j) for j in range(16)]))
            fifth = b.select(b.icmp_unsigned("!=", bit, zero), sixteen, zero)
            q.append(b.sitofp(b.sub(b.or_(nib, fifth), sixteen), V16F32))
    t = b.fmul(q[0], blk.xs(0))
    add_scaled(blk, acc[0], b.call(blk.fma, [q[1], blk.xs(16), t]), blk.half(0))


def _lane_order_q4_k() -> NDArray[np.int64]:
    """Where each float of a Q4_K block's activation goes in the lane order `_emit_q4_k` reads: 64 qs
    bytes (chunks 2p, 2p + 1) load as 16 32-bit lanes, lane i holding bytes 4i..4i+3, and nibble j of
    a lane is byte j // 2's low (j even) or high nibble: weight 32 (2 chunk + j % 2) + its byte in the chunk."""
    order = np.empty(256, np.int64)
    for p in range(2):
        for j in range(8):
            for i in range(16):
                chunk = 2 * p + i // 8
                order[128 * p + 16 * j + i] = 32 * (2 * chunk + j % 2) + 4 * (i % 8) + j // 2
    return order


def _lane_order_q6_k() -> NDArray[np.int64]:
    """Where each float of a Q6_K block's activation goes for `_emit_q6_k`: per half h, the 64 ql bytes
    as 16 lanes (lanes 8-15 the bytes of t = 1, 3), n = 0 their low nibbles (t = 0, 1) and n = 1 their
    high ones (t = 2, 3), byte k of each."""
    order = np.empty(256, np.int64)
    for h in range(2):
        for n in range(2):
            for k in range(4):
                for i in range(16):
                    order[128 * h + 64 * n + 16 * k + i] = 128 * h + 32 * (2 * n + i // 8) + 4 * (i % 8) + k
    return order


LANES_Q4_K, LANES_Q6_K = _lane_order_q4_k(), _lane_order_q6_k()


def _q4_k_emit(permute: bool):  # type: ignore[no-untyped-def]
    """Q4_K's block codegen; `permute` (AVX-512): each nibble's float32 by vpermps from the table 0..15,
    which reads only the low 4 bits of each lane (no mask, no conversion; the same floats)."""
    def emit(blks, accs, maccs):  # type: ignore[no-untyped-def]
        _emit_q4_k(blks, accs, maccs, permute)

    return emit


def _emit_q4_k(blks, accs, maccs, permute):  # type: ignore[no-untyped-def]
    """Q4_K, 256 weights in 144 bytes: byte 0-1 d | 2-3 dmin | 4-15 scales | 16-143 qs, where 32-byte
    chunk c holds sub-block 2c in its low nibbles and 2c + 1 in its high ones. 64 qs bytes load as 16
    32-bit lanes and each of a lane's 8 nibbles is a shift and a mask away, lane-wise (no shuffles):
      lane i (bytes 4i..4i+3):  [b3 hi|b3 lo|b2 hi|b2 lo|b1 hi|b1 lo|b0 hi|b0 lo]   nibble j = lane >> 4j & 15
    the activation comes in that lane order (LANES_Q4_K). Lanes 0-7 are chunk 2p's, 8-15 chunk 2p + 1's,
    so the 4 nibbles j of one parity share a scale per half: summed unscaled, then scaled once. The
    rows of `blks` are unpacked side by side, each activation vector loaded once for all of them."""
    b = blks[0].b
    if permute:
        perm = cgutils.get_or_insert_function(b.module, ir.FunctionType(V16F32, [V16F32, V16I32]),
                                              "llvm.x86.avx512.permvar.sf.512")
        table = ir.Constant(V16F32, [float(i) for i in range(16)])
    scales = []
    for blk, macc in zip(blks, maccs):
        sc, mins = _k_scales(blk, blk.half(0), blk.half(2))
        xsum = b.load(b.bitcast(blk.xsum, ir.PointerType(V8F32)), typ=V8F32, align=4)
        b.store(b.call(blk.fma8, [mins, xsum, b.load(macc)]), macc)
        scales.append(sc)
    for p in range(2):
        vs = [blk.load(16 + 64 * p, V16I32) for blk in blks]
        parts = [[None, None] for _ in blks]
        for j in range(8):
            x = blks[0].xs(128 * p + 16 * j)
            for v, part in zip(vs, parts):
                nib = b.lshr(v, i32s(4 * j)) if j else v
                if permute:
                    qf = b.call(perm, [table, nib])
                else:
                    qf = b.sitofp(b.and_(nib, i32s(15)) if j < 7 else nib, V16F32)
                part[j % 2] = b.fmul(qf, x) if part[j % 2] is None else b.call(blks[0].fma, [qf, x, part[j % 2]])
        for sc, part, acc in zip(scales, parts, accs):
            for parity in range(2):
                lanes = [4 * p + parity] * 8 + [4 * p + 2 + parity] * 8
                sv = b.shuffle_vector(sc, sc, ir.Constant(ir.VectorType(I32, 16), lanes))
                b.store(b.call(blks[0].fma, [part[parity], sv, b.load(acc[parity])]), acc[parity])


def _q6_k_emit(magic: bool):  # type: ignore[no-untyped-def]
    """Q6_K's block codegen; `magic` (AVX-512, whose vpternlogd masks and sets bits in one instruction):
    each 6-bit integer into a float32's mantissa under a fixed exponent, then that float minus
    (its power of two + 32) -- exactly q - 32, the same floats as the conversion; byte k of a lane
    (q at bits 8k..8k+5) under the exponent of 2^(23 - 8k), so that no shift brings it down (k < 3):
      [0|exponent of 2^(23-8k)|0..0|q|0..0]  =  2^(23-8k) + q      (q's lowest bit at mantissa bit 8k)
    three instructions per 16 weights where shift left, arithmetic shift right and conversion are
    four, and no bytewise subtraction of 32 before."""
    def emit(blks, accs, maccs):  # type: ignore[no-untyped-def]
        _emit_q6_k(blks, accs, maccs, magic)

    return emit


def _emit_q6_k(blks, accs, maccs, magic):  # type: ignore[no-untyped-def]
    """Q6_K, 256 weights in 210 bytes, w = (d sc[e // 16]) (q - 32), q 6 bits (reference.py):
       byte 0-127 ql (low 4 bits) | 128-191 qh (high 2 bits) | 192-207 sc (int8) | 208-209 d (f16)
    weight e = 128h + 32t + c: low = ql[64h + 32(t % 2) + c] >> 4(t // 2) & 15, high = qh[32h + c] >> 2t & 3.
    In 32-bit lanes, per half h: ql's 64 bytes as 16 lanes (lanes 8-15 hold t = 1, 3) and qh's 32 bytes
    twice (lanes 8-15 shifted right by 2), so each byte's integer is built for 4 weights a lane at once:
      t = 0, 1:  ql & 0x0f | (qh << 4) & 0x30        t = 2, 3:  (ql >> 4) & 0x0f | qh & 0x30
    then 32 off bytewise, and byte k out by a shift left and an arithmetic shift right (or, `magic`,
    each byte as a float's mantissa: _q6_k_emit). The activation is in that lane order (LANES_Q6_K); the
    four k share each lane's scale: summed, then scaled. The rows of `blks` side by side, each
    activation vector loaded once for all of them."""
    b = blks[0].b
    scales = []
    for blk in blks:
        d = blk.half(208)
        scales.append(b.fmul(b.sitofp(b.sext(blk.load(192, V16I8), V16I32), V16F32), splat(b, d, V16F32)))
    for h in range(2):
        qs = []
        for blk in blks:
            ql = blk.load(64 * h, V16I32)
            qh8 = blk.load(128 + 32 * h, V8I32)
            qh = b.shuffle_vector(qh8, b.lshr(qh8, ir.Constant(V8I32, [2] * 8)),
                                  ir.Constant(ir.VectorType(I32, 16), list(range(16))))
            q01 = b.or_(b.and_(ql, i32s(0x0F0F0F0F)), b.and_(b.shl(qh, i32s(4)), i32s(0x30303030)))
            q23 = b.or_(b.and_(b.lshr(ql, i32s(4)), i32s(0x0F0F0F0F)), b.and_(qh, i32s(0x30303030)))
            qs.append([q01, q23] if magic else
                      [b.bitcast(b.sub(b.bitcast(q, V64I8), bytes_(64, 32)), V16I32) for q in (q01, q23)])
        for n in range(2):
            parts = [None] * len(blks)
            for k in range(4):
                x = blks[0].xs(128 * h + 64 * n + 16 * k)
                for i, q in enumerate(qs):
                    if magic:  # 2^(23 - 8k) + q, less 2^(23 - 8k) + 32 (byte 3 first down to byte 0's place)
                        v = b.and_(q[n], i32s(0x3F << 8 * k)) if k < 3 else b.lshr(q[n], i32s(24))
                        e = 23 - 8 * k if k < 3 else 23
                        f = b.bitcast(b.or_(v, i32s((127 + e) << 23)), V16F32)
                        qf = b.fsub(f, ir.Constant(V16F32, [float(2 ** e + 32)] * 16))
                    else:
                        qf = b.sitofp(b.ashr(b.shl(q[n], i32s(24 - 8 * k)) if k < 3 else q[n], i32s(24)), V16F32)
                    parts[i] = b.fmul(qf, x) if parts[i] is None else b.call(blks[0].fma, [qf, x, parts[i]])
            lanes = [8 * h + 4 * n + i // 4 for i in range(16)]
            for sc, part, acc in zip(scales, parts, accs):
                sv = b.shuffle_vector(sc, sc, ir.Constant(ir.VectorType(I32, 16), lanes))
                b.store(b.call(blks[0].fma, [part, sv, b.load(acc[n])]), acc[n])


# AVX-512 (32 vector registers, vpermps, vpternlogd): Q4_K's nibbles to float32 by vpermps, Q6_K's
# integers by the exponent trick (_q6_k_emit), and rows of at least LONG_ROW weights several a call
# (2 for Q4_K, 4 for Q6_K), the activation's vectors loaded once for them: an activation of 24 KB and
# more no longer stays in L1. Streamed from memory, GB per CPU-second on one thread against the
# one-row AVX2 form (bench_direct_kernels.py, a busy machine): Q4_K 10240 columns 8.8 -> 11.5, 6912
# 10.0 -> 11.1, 2560 11.0 -> 12.3; Q6_K 10240 9.9 -> 12.5, 6912 10.5 -> 12.4, 2560 11.3 -> 14.2.
# Shorter rows stay one a call: rows side by side are as many streams of a row's length, too short
# for the hardware prefetcher (Q6_K at 2560 columns: 8.9 four a call), where one row after another
# is one stream. With AVX2's 16 registers the rows' accumulators spill (two rows 10% slower in L2)
# and there is no vpternlogd: the one-row form, as before.
WIDE = isa.target_has("avx512f")
ROWS_Q4_K, ROWS_Q6_K = (2, 4) if WIDE else (1, 1)
LONG_ROW = 6144
Q4_K_ROW, _Q4_KN = row_kernel(144, 256, _q4_k_emit(WIDE)), row_kernel(144, 256, _q4_k_emit(WIDE), rows=ROWS_Q4_K)
_Q6_K1, _Q6_KN = row_kernel(210, 256, _q6_k_emit(WIDE)), row_kernel(210, 256, _q6_k_emit(WIDE), rows=ROWS_Q6_K)
_Q6_K_PLAIN = row_kernel(210, 256, _q6_k_emit(False))  # the AVX2 form on every target (the tests' reference)
_Q4_K_PLAIN = row_kernel(144, 256, _q4_k_emit(False))  # the AVX2 form on every target (the tests' reference)
_Q5_K, _Q4_0 = row_kernel(176, 256, each_row(_emit_q5_k)), row_kernel(18, 32, each_row(_emit_q4_0))
Q5_0_ROW = row_kernel(22, 32, each_row(_q5_0_emit(WIDE)))
_Q5_0_PLAIN = row_kernel(22, 32, each_row(_q5_0_emit(False)))  # the AVX2 form on every target


@njit(cache=True)
def group_sums(x: NDArray[np.float32]) -> NDArray[np.float32]:  # pragma: no cover - numba
    """The sums of x's groups of 32 (what the k-quants' mins multiply), padded to whole blocks of 8."""
    n = x.shape[0] // 32
    xsum = np.zeros((n + 7) // 8 * 8, dtype=np.float32)
    for k in range(n):
        t = np.float32(0.0)
        for i in range(32):
            t += x[32 * k + i]
        xsum[k] = t
    return xsum


@njit(cache=True)
def in_lane_order(x: NDArray[np.float32], order: NDArray[np.int64]) -> NDArray[np.float32]:  # pragma: no cover - numba
    """x with each block of 256 in the lane order `order` (a kernel's LANES_*), once per call."""
    out = np.empty_like(x)
    for k in range(x.shape[0] // 256):
        for m in range(256):
            out[256 * k + m] = x[256 * k + order[m]]
    return out


@njit(cache=True, parallel=True)
def matvec_q4_k(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = row r of the Q4_K blocks w `[rows, 144 * blocks]` times x `[256 * blocks]`: ROWS_Q4_K rows a
    call for rows of LONG_ROW weights or more, else one (each row's sums those of matvec_q4_k_one, the
    same bits)."""
    xsum = group_sums(x)
    xl = in_lane_order(x, LANES_Q4_K)
    if ROWS_Q4_K > 1 and x.shape[0] >= LONG_ROW:
        n = w.shape[0] // ROWS_Q4_K
        for r in prange(n):
            _Q4_KN(w, ROWS_Q4_K * r, xl, xsum, out)
        for r in range(n * ROWS_Q4_K, w.shape[0]):
            Q4_K_ROW(w, r, xl, xsum, out)
    else:
        for r in prange(w.shape[0]):
            Q4_K_ROW(w, r, xl, xsum, out)


@njit(cache=True, parallel=True)
def matvec_q4_k_one(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """matvec_q4_k a row a call, its nibbles converted by shift, mask and cvtdq2ps on every target."""
    xsum = group_sums(x)
    xl = in_lane_order(x, LANES_Q4_K)
    for r in prange(w.shape[0]):
        _Q4_K_PLAIN(w, r, xl, xsum, out)


@njit(cache=True, parallel=True)
def matvec_q5_k(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = row r of the Q5_K blocks w `[rows, 176 * blocks]` times x `[256 * blocks]`."""
    xsum = group_sums(x)
    for r in prange(w.shape[0]):
        _Q5_K(w, r, x, xsum, out)


@njit(cache=True, parallel=True)
def matvec_q6_k(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = row r of the Q6_K blocks w `[rows, 210 * blocks]` times x `[256 * blocks]`: ROWS_Q6_K rows a
    call for rows of LONG_ROW weights or more, else one (each row's sums those of matvec_q6_k_one, the
    same bits)."""
    xl = in_lane_order(x, LANES_Q6_K)
    if ROWS_Q6_K > 1 and x.shape[0] >= LONG_ROW:
        n = w.shape[0] // ROWS_Q6_K
        for r in prange(n):
            _Q6_KN(w, ROWS_Q6_K * r, xl, xl, out)
        for r in range(n * ROWS_Q6_K, w.shape[0]):
            _Q6_K1(w, r, xl, xl, out)
    else:
        for r in prange(w.shape[0]):
            _Q6_K1(w, r, xl, xl, out)


@njit(cache=True, parallel=True)
def matvec_q6_k_one(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """matvec_q6_k a row a call, its integers converted by shifts and cvtdq2ps on every target."""
    xl = in_lane_order(x, LANES_Q6_K)
    for r in prange(w.shape[0]):
        _Q6_K_PLAIN(w, r, xl, xl, out)


@njit(cache=True, parallel=True)
def matvec_q5_0(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = row r of the Q5_0 blocks w `[rows, 22 * blocks]` times x `[32 * blocks]`."""
    for r in prange(w.shape[0]):
        Q5_0_ROW(w, r, x, x, out)


@njit(cache=True, parallel=True)
def matvec_q5_0_one(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """matvec_q5_0 with its integers by test, select and cvtdq2ps on every target (the same bits)."""
    for r in prange(w.shape[0]):
        _Q5_0_PLAIN(w, r, x, x, out)


@njit(cache=True, parallel=True)
def matvec_q4_0(w: NDArray[np.uint8], x: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[r] = row r of the Q4_0 blocks w `[rows, 18 * blocks]` times x `[32 * blocks]`."""
    for r in prange(w.shape[0]):
        _Q4_0(w, r, x, x, out)


# the direct kernel of each type that has one: kernel(w `[rows, bytes]`, x, out)
MATVEC: dict[int, Callable[[NDArray[np.uint8], NDArray[np.float32], NDArray[np.float32]], None]] = {
    int(GGMLType.Q4_K): matvec_q4_k, int(GGMLType.Q5_K): matvec_q5_k, int(GGMLType.Q6_K): matvec_q6_k,
    int(GGMLType.Q4_0): matvec_q4_0, int(GGMLType.Q5_0): matvec_q5_0}
