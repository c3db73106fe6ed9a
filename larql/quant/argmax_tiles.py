"""The candidate pass of argmax.py on a tiled int8 copy of the Q8_0 lm_head: 16 rows per instruction.

argmax.py's pass reads the GGUF rows as they are: per row and 32-column block, one 256-bit vpdpbusd
(plus one for the +128 offset), an f16 scale conversion and a horizontal multiply-add, ~17 micro-ops
per 34 bytes. On Gemma 3's 262,144 x 640 lm_head that is ~12 ms a token, compute-bound, while the
memory streams its 178 MB in ~6 ms. Here the weights are copied once (`tile`) so that one 64-byte
load holds 4 consecutive codes of 16 rows: a 512-bit vpdpbusd against the activation's 4 codes
(broadcast from memory) advances 16 rows at once, ~20 micro-ops per 16 x 34 bytes.

Which side is unsigned: vpdpbusd multiplies unsigned bytes by signed bytes. The weights are stored
as q_w + 128 (q_w XOR 0x80) and the activation stays signed, so per block
  sum_j (q_w + 128) q_x = dot(q_w, q_x) + 128 sum_j q_x,
and the accumulator starts at -128 sum_j q_x (one splat per block; the same for every row).

The scores are the same quantity as argmax.py's (the same int8 codes, the same block dots, exact in
int32), summed in another order: each block's float(dot) x (d_w x d_x) is one fma into a float32
accumulator per row. Rounding: d_w x d_x (1), the fma (1 for the block, then nb additions), so
|A_r - w_r . x̂| <= (nb + 2) 2^-24 sum_k |d_k dx_k s_k| <= c |w_r| |x̂| with argmax.py's
c = 1.01 (n + 2) 2^-24 (n >= nb): its bound and its rescoring apply unchanged.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

from larql.quant import isa
from larql.quant.ir_parts import ir_row, splat
from larql.quant.q8_bounds import bound_slack, quantize_q8

ROWS = 16  # rows per tile: the 16 int32 lanes of one 512-bit vector
CHUNK = 64  # tiles per unit of parallel work (1,024 rows), each keeping its best score
_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_V64I8, _V16I32, _V16F32 = ir.VectorType(_I8, 64), ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)
_V16F16, _V8F16 = ir.VectorType(ir.HalfType(), 16), ir.VectorType(ir.HalfType(), 8)
_V32I8, _V16I16, _V8I32, _V8F32 = (ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8),
                                   ir.VectorType(_F32, 8))


@njit(cache=True, parallel=True)
def tile(raw: NDArray[np.uint8], packed: NDArray[np.uint8], scales: NDArray[np.uint16]) -> None:  # pragma: no cover - numba
    """Copy Q8_0 rows raw `[rows, nb * 34]` into tiles of 16 rows. A Q8_0 block (34 bytes):

        byte 0-1  d (f16)  | 2 .. 33  32 x int8 q

    and per tile t, block k, group g of 4 columns (rows past the matrix: code 0, scale 0):

        packed[t, 512 k + 64 g + 4 i + m] = q[16 t + i, 32 k + 4 g + m] XOR 0x80   (q + 128, uint8)
        scales[t, 16 k + i]               = d[16 t + i, k]                         (the f16 bits)
    """
    rows, nb = raw.shape[0], raw.shape[1] // 34
    for t in prange(packed.shape[0]):
        for i in range(ROWS):
            r = ROWS * t + i
            if r >= rows:  # padding: code 0 (stored 128), scale 0
                for k in range(nb):
                    scales[t, 16 * k + i] = np.uint16(0)
                    for j in range(32):
                        packed[t, 512 * k + 64 * (j // 4) + 4 * i + j % 4] = np.uint8(0x80)
                continue
            src = raw[r]
            dst = packed[t]
            for k in range(nb):
                b = 34 * k
                scales[t, 16 * k + i] = np.uint16(src[b]) | (np.uint16(src[b + 1]) << np.uint16(8))
                o = 512 * k + 4 * i
                for g in range(8):
                    for m in range(4):
                        dst[o + 64 * g + m] = src[b + 2 + 4 * g + m] ^ np.uint8(0x80)


@intrinsic
def _tile_scores(typingctx, packed, scales, xq, corr, dx, t, out):  # type: ignore[no-untyped-def]
    """A of tile t's 16 rows into out[16 t .. 16 t + 15] (float32); returns their maximum.

    Per block k: 4 int32 accumulators (two groups of 4 columns each, so that no vpdpbusd waits on
    the one before: the chain is 2 long, not 8), the first starting at corr[k] = -128 sum q_x;
    their sum s (exact: |s| <= 32 x 127 x 127 < 2^24, so float(s) is exact too) goes into the row
    accumulators as fma(float(s), f16->f32(d_w) x dx[k], acc). xq: the activation's int8 codes
    read 4 at a time (int32 view)."""
    sig = types.float32(packed, scales, xq, corr, dx, t, out)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        a = signature.args
        p_row, nb = ir_row(context, builder, a[0], args[0], args[5], 512)
        s_row, _ = ir_row(context, builder, a[1], args[1], args[5], 2)
        xa = context.make_array(a[2])(context, builder, args[2]).data
        ca = context.make_array(a[3])(context, builder, args[3]).data
        da = context.make_array(a[4])(context, builder, args[4]).data
        oa = context.make_array(a[6])(context, builder, args[6]).data
        dp = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16I32, [_V16I32, _V64I8, _V64I8]),
                                            "llvm.x86.avx512.vpdpbusd.512")
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16F32, [_V16F32] * 3), "llvm.fma.v16f32")
        fmax = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16F32, [_V16F32] * 2),
                                              "llvm.maxnum.v16f32")
        acc = cgutils.alloca_once_value(builder, ir.Constant(_V16F32, None))
        zero = ir.Constant(_V16I32, None)
        with cgutils.for_range(builder, nb) as loop:
            k = loop.index
            base = builder.mul(k, ir.Constant(_I64, 512))
            c = builder.load(builder.gep(ca, [k], source_etype=_I32), typ=_I32)
            parts = [splat(builder, c, _V16I32), zero, zero, zero]
            for g in range(8):
                w = builder.load(builder.gep(p_row, [builder.add(base, ir.Constant(_I64, 64 * g))], source_etype=_I8),
                                 typ=_V64I8, align=1)
                x4 = builder.load(builder.gep(xa, [builder.add(builder.mul(k, ir.Constant(_I64, 8)), ir.Constant(_I64, g))], source_etype=_I32),
                                  typ=_I32)
                xv = builder.bitcast(splat(builder, x4, _V16I32), _V64I8)
                parts[g % 4] = builder.call(dp, [parts[g % 4], w, xv])
            s = builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))
            d16 = builder.load(builder.gep(s_row, [builder.mul(k, ir.Constant(_I64, 32))], source_etype=_I8),
                               typ=_V16F16, align=1)
            scale = builder.fmul(builder.fpext(d16, _V16F32),
                                 splat(builder, builder.load(builder.gep(da, [k], source_etype=_F32), typ=_F32), _V16F32))
            builder.store(builder.call(fma, [builder.sitofp(s, _V16F32), scale, builder.load(acc)]), acc)
        v = builder.load(acc)
        dst = builder.gep(oa, [builder.mul(args[5], ir.Constant(_I64, ROWS))], source_etype=_F32)
        builder.store(v, builder.bitcast(dst, _V16F32.as_pointer()), align=4)
        for width in (8, 4, 2, 1):  # the lanes' maximum: halve and compare
            hi = builder.shuffle_vector(v, v, ir.Constant(_V16I32, [(j + width) % 16 for j in range(16)]))
            v = builder.call(fmax, [v, hi])
        return builder.extract_element(v, ir.Constant(_I32, 0))

    return sig, codegen


@intrinsic
def tile_scores_avx2(typingctx, packed, scales, xq, dx, t, out):  # type: ignore[no-untyped-def]
    """_tile_scores in AVX2 (no vpdpbusd): the same block dots s, exact, and the same float32 steps
    per row, so the same A bit for bit; the tile's 16 rows as two halves of 8 int32 lanes.

    vpmaddubsw multiplies unsigned by signed bytes into saturating int16 pairs, and the stored
    q_w + 128 times a signed q_x could saturate (2 x 255 x 127). So, as llama.cpp's AVX2 dot, the
    weight's sign moves to the activation: per 32-byte load (rows 8h..8h+7, 4 codes each)
        w = stored XOR 0x80 (q_w, signed)    |w| (vpabsb; -128 reads 128 unsigned)
        vpmaddubsw(|w|, vpsignb(q_x, w))     pairs |.| <= 2 x 128 x 127 = 32,512 < 2^15: exact
        vpmaddwd(pairs, 1)                   4 products per int32 lane, as vpdpbusd's
    q_x is never -128 (quantize_q8 clamps to -127..127), so vpsignb's negation is exact."""
    sig = types.float32(packed, scales, xq, dx, t, out)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        a = signature.args
        p_row, nb = ir_row(context, builder, a[0], args[0], args[4], 512)
        s_row, _ = ir_row(context, builder, a[1], args[1], args[4], 2)
        xa = context.make_array(a[2])(context, builder, args[2]).data
        da = context.make_array(a[3])(context, builder, args[3]).data
        oa = context.make_array(a[5])(context, builder, args[5]).data
        mod = builder.module
        ubsw = cgutils.get_or_insert_function(mod, ir.FunctionType(_V16I16, [_V32I8, _V32I8]), "llvm.x86.avx2.pmadd.ub.sw")
        wd = cgutils.get_or_insert_function(mod, ir.FunctionType(_V8I32, [_V16I16, _V16I16]), "llvm.x86.avx2.pmadd.wd")
        sign = cgutils.get_or_insert_function(mod, ir.FunctionType(_V32I8, [_V32I8, _V32I8]), "llvm.x86.avx2.psign.b")
        absb = cgutils.get_or_insert_function(mod, ir.FunctionType(_V32I8, [_V32I8, ir.IntType(1)]), "llvm.abs.v32i8")
        fma = cgutils.get_or_insert_function(mod, ir.FunctionType(_V8F32, [_V8F32] * 3), "llvm.fma.v8f32")
        fmax = cgutils.get_or_insert_function(mod, ir.FunctionType(_V8F32, [_V8F32] * 2), "llvm.maxnum.v8f32")
        flip, ones = ir.Constant(_V32I8, [0x80] * 32), ir.Constant(_V16I16, [1] * 16)
        acc = [cgutils.alloca_once_value(builder, ir.Constant(_V8F32, None)) for _ in range(2)]
        with cgutils.for_range(builder, nb) as loop:
            k = loop.index
            base = builder.mul(k, ir.Constant(_I64, 512))
            parts = [[ir.Constant(_V8I32, None)] * 2 for _ in range(2)]
            for g in range(8):
                x4 = builder.load(builder.gep(xa, [builder.add(builder.mul(k, ir.Constant(_I64, 8)), ir.Constant(_I64, g))],
                                              source_etype=_I32), typ=_I32)
                xv = builder.bitcast(splat(builder, x4, _V8I32), _V32I8)
                for h in range(2):
                    at = builder.add(base, ir.Constant(_I64, 64 * g + 32 * h))
                    w = builder.xor(builder.load(builder.gep(p_row, [at], source_etype=_I8), typ=_V32I8, align=1), flip)
                    pairs = builder.call(ubsw, [builder.call(absb, [w, ir.Constant(ir.IntType(1), 0)]),
                                                builder.call(sign, [xv, w])])
                    parts[h][g % 2] = builder.add(parts[h][g % 2], builder.call(wd, [pairs, ones]))
            dxk = splat(builder, builder.load(builder.gep(da, [k], source_etype=_F32), typ=_F32), _V8F32)
            for h in range(2):
                s = builder.add(parts[h][0], parts[h][1])
                d16 = builder.load(builder.gep(s_row, [builder.add(builder.mul(k, ir.Constant(_I64, 32)), ir.Constant(_I64, 16 * h))],
                                               source_etype=_I8), typ=_V8F16, align=1)
                scale = builder.fmul(builder.fpext(d16, _V8F32), dxk)
                builder.store(builder.call(fma, [builder.sitofp(s, _V8F32), scale, builder.load(acc[h])]), acc[h])
        v = [builder.load(acc[h]) for h in range(2)]
        dst = builder.gep(oa, [builder.mul(args[4], ir.Constant(_I64, ROWS))], source_etype=_F32)
        for h in range(2):
            builder.store(v[h], builder.bitcast(builder.gep(dst, [ir.Constant(_I64, 8 * h)], source_etype=_F32),
                                                _V8F32.as_pointer()), align=4)
        m = builder.call(fmax, [v[0], v[1]])
        for width in (4, 2, 1):  # the lanes' maximum: halve and compare
            m = builder.call(fmax, [m, builder.shuffle_vector(m, m, ir.Constant(_V8I32, [(j + width) % 8 for j in range(8)]))])
        return builder.extract_element(m, ir.Constant(_I32, 0))

    return sig, codegen


@njit(cache=True)
def quantize_signed(x: NDArray[np.float32], xq: NDArray[np.int8], corr: NDArray[np.int32],
                    dx: NDArray[np.float32]) -> tuple[float, float]:  # pragma: no cover - numba
    """Q8_0 of x `[n]` by q8_bounds.quantize_q8 (the same codes), kept signed: xq int8 `[n]`,
    corr[k] = -128 x (block k's code sum), dx `[n / 32]`. Returns (|x̂ - x|, |x̂|) in float64."""
    xu = np.empty(x.shape[0], dtype=np.uint8)  # the codes as argmax.py's pass reads them: q + 128
    errs = quantize_q8(x, xu, dx)
    for k in range(x.shape[0] // 32):
        total = np.int32(0)
        for i in range(32):
            q = np.int32(xu[32 * k + i]) - 128
            xq[32 * k + i] = np.int8(q)
            total += q
        corr[k] = -128 * total
    return errs


@njit(cache=True, parallel=True)
def scores(packed: NDArray[np.uint8], scales: NDArray[np.uint16], n_rows: int, x: NDArray[np.float32],
           out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """A `[n_rows]` (out, padded to whole tiles) for activation x: the scan alone, for tests."""
    n = x.shape[0]
    xq = np.empty(n, dtype=np.int8)
    corr = np.empty(n // 32, dtype=np.int32)
    dx = np.empty(n // 32, dtype=np.float32)
    quantize_signed(x, xq, corr, dx)
    for t in prange(packed.shape[0]):
        _tile_scores(packed, scales, xq.view(np.int32), corr, dx, t, out)  # type: ignore[call-arg]


@njit(cache=True, parallel=True)
def candidates(packed: NDArray[np.uint8], scales: NDArray[np.uint16], n_rows: int, x: NDArray[np.float32],
               norms: NDArray[np.float64], chunk_norm: NDArray[np.float64], c: float
               ) -> NDArray[np.int64]:  # pragma: no cover - numba
    """The rows of the tiled matrix that may hold the largest exact logit for x, ascending (the
    VNNI kernel; `pick` has the selection)."""
    n = x.shape[0]
    xq = np.empty(n, dtype=np.int8)
    corr = np.empty(n // 32, dtype=np.int32)
    dx = np.empty(n // 32, dtype=np.float32)
    err, hat = quantize_signed(x, xq, corr, dx)
    n_tiles = packed.shape[0]
    approx = np.empty(n_tiles * ROWS, dtype=np.float32)
    n_chunks = (n_tiles + CHUNK - 1) // CHUNK
    best_a = np.empty(n_chunks, dtype=np.float32)
    best_r = np.empty(n_chunks, dtype=np.int64)
    x32 = xq.view(np.int32)
    for ch in prange(n_chunks):
        top, at = np.float32(-np.inf), -1
        for t in range(ch * CHUNK, min(n_tiles, (ch + 1) * CHUNK)):
            v: float = _tile_scores(packed, scales, x32, corr, dx, t, approx)  # type: ignore[call-arg]
            if v > top or at < 0 or ROWS * t + ROWS > n_rows:
                for r in range(ROWS * t, min(n_rows, ROWS * t + ROWS)):  # which row (past the end: none)
                    if approx[r] > top or at < 0:
                        top, at = approx[r], r
        best_a[ch], best_r[ch] = top, at
    return pick(approx, best_a, best_r, n_rows, norms, chunk_norm, bound_slack(x, err, hat, c))


@njit(cache=True, parallel=True)
def scores_avx2(packed: NDArray[np.uint8], scales: NDArray[np.uint16], n_rows: int, x: NDArray[np.float32],
                out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """`scores` with the AVX2 kernel (the same A, bit for bit), for tests."""
    n = x.shape[0]
    xq = np.empty(n, dtype=np.int8)
    corr = np.empty(n // 32, dtype=np.int32)
    dx = np.empty(n // 32, dtype=np.float32)
    quantize_signed(x, xq, corr, dx)
    for t in prange(packed.shape[0]):
        tile_scores_avx2(packed, scales, xq.view(np.int32), dx, t, out)  # type: ignore[call-arg]


@njit(cache=True, parallel=True)
def candidates_avx2(packed: NDArray[np.uint8], scales: NDArray[np.uint16], n_rows: int, x: NDArray[np.float32],
                    norms: NDArray[np.float64], chunk_norm: NDArray[np.float64], c: float
                    ) -> NDArray[np.int64]:  # pragma: no cover - numba
    """`candidates` with the AVX2 kernel: the same scores, so the same rows."""
    n = x.shape[0]
    xq = np.empty(n, dtype=np.int8)
    corr = np.empty(n // 32, dtype=np.int32)
    dx = np.empty(n // 32, dtype=np.float32)
    err, hat = quantize_signed(x, xq, corr, dx)
    n_tiles = packed.shape[0]
    approx = np.empty(n_tiles * ROWS, dtype=np.float32)
    n_chunks = (n_tiles + CHUNK - 1) // CHUNK
    best_a = np.empty(n_chunks, dtype=np.float32)
    best_r = np.empty(n_chunks, dtype=np.int64)
    x32 = xq.view(np.int32)
    for ch in prange(n_chunks):
        top, at = np.float32(-np.inf), -1
        for t in range(ch * CHUNK, min(n_tiles, (ch + 1) * CHUNK)):
            v: float = tile_scores_avx2(packed, scales, x32, dx, t, approx)  # type: ignore[call-arg]
            if v > top or at < 0 or ROWS * t + ROWS > n_rows:
                for r in range(ROWS * t, min(n_rows, ROWS * t + ROWS)):
                    if approx[r] > top or at < 0:
                        top, at = approx[r], r
        best_a[ch], best_r[ch] = top, at
    return pick(approx, best_a, best_r, n_rows, norms, chunk_norm, bound_slack(x, err, hat, c))


@njit(cache=True)
def pick(approx: NDArray[np.float32], best_a: NDArray[np.float32], best_r: NDArray[np.int64], n_rows: int,
         norms: NDArray[np.float64], chunk_norm: NDArray[np.float64], slack: float
         ) -> NDArray[np.int64]:  # pragma: no cover - numba
    """The candidates from the scores A: every chunk of CHUNK tiles has kept the row of its largest
    A (best_a, best_r); m = the largest A_r - E_r over those rows is at most max_r F_r (argmax.py:
    F_r >= A_r - E_r), so a row with A_r + E_r < m is not the argmax. Only chunks whose best A plus
    their largest E (chunk_norm: the chunk's largest |w_r|) reaches m are searched row by row, in
    float64 as argmax._select."""
    n_chunks = best_a.shape[0]
    m = -np.inf
    for ch in range(n_chunks):
        r = best_r[ch]
        if r >= 0:
            m = max(m, np.float64(approx[r]) - norms[r] * slack)
    count = 0
    keep = np.zeros(n_chunks, dtype=np.bool_)
    for ch in range(n_chunks):
        if np.float64(best_a[ch]) + chunk_norm[ch] * slack >= m:
            keep[ch] = True
            for r in range(ch * CHUNK * ROWS, min(n_rows, (ch + 1) * CHUNK * ROWS)):
                if np.float64(approx[r]) + norms[r] * slack >= m:
                    count += 1
    out = np.empty(count, dtype=np.int64)
    j = 0
    for ch in range(n_chunks):
        if keep[ch]:
            for r in range(ch * CHUNK * ROWS, min(n_rows, (ch + 1) * CHUNK * ROWS)):
                if np.float64(approx[r]) + norms[r] * slack >= m:
                    out[j] = r
                    j += 1
    return out


class Tiled:
    """A Q8_0 matrix's tiled copy (`tile`), with its row norms and each chunk's largest norm."""

    def __init__(self, raw: NDArray[np.uint8], norms: NDArray[np.float64]) -> None:
        rows, nb = raw.shape[0], raw.shape[1] // 34
        n_tiles = (rows + ROWS - 1) // ROWS
        self.n_rows = rows
        self.packed = np.empty((n_tiles, 512 * nb), dtype=np.uint8)
        self.scales = np.empty((n_tiles, 16 * nb), dtype=np.uint16)
        tile(raw, self.packed, self.scales)
        self.norms = norms
        per = CHUNK * ROWS
        padded = np.zeros(-(-rows // per) * per)
        padded[:rows] = norms
        self.chunk_norm = padded.reshape(-1, per).max(axis=1)

    @property
    def nbytes(self) -> int:
        return int(self.packed.nbytes + self.scales.nbytes)

    def candidates(self, x: NDArray[np.float32], c: float) -> NDArray[np.int64]:
        """argmax.candidate_rows on this copy: x `[n]` finite, c the rounding constant."""
        run = candidates_avx2 if isa.TIER == "avx2" else candidates  # the tier's kernel (isa)
        return run(self.packed, self.scales, self.n_rows, x, self.norms, self.chunk_norm, c)
