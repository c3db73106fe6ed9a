"""down_meta's int8 pass in AVX2 (topk_kernels has the bound): the same packed token tiles as the
VNNI micro-kernel (signed), feature codes of 7 bits, and the same float32 steps.

AVX2 has no vpdpbusd. vpmaddubsw multiplies unsigned by signed bytes and adds adjacent pairs into
saturating int16, and vpmaddwd by ones adds those pairs into int32. The token codes (-127..127:
a Q8_0 unembedding's own codes, so exact) are the signed operand; the feature's codes are made
with 63 levels each side (-63..63, topk_kernels.quantize_blocks' qmax) and stored as c + 64, 1..127,
the unsigned operand. A pair then sums to at most 2 x 127 x 127 = 32,258 < 2^15: exact, and
each 32 products cost one broadcast, vpmaddubsw, vpmaddwd and vpaddd (no vpsignb, no second
broadcast of |w|, which the 8-bit form needed). The +64 is taken back per token and block: each
block's int32 sums start at -64 x the token's block code sum (`token_corr`, made once per vocabulary).

The feature's coarser codes only widen the bound E (||w - w^|| doubles; the token side's error is
zero for a Q8_0 unembedding): more candidates are rescored, the same ids and values come out.
The tile goes in four steps of 8 tokens, so MR int32 and MR float32 accumulators fit AVX2's 16
registers. Summing several vpmaddubsw results in int16 before vpmaddwd (exact while a lane's
|w . u| fits 2^15, checkable per tile from code norms), or sharing each broadcast across two or
four token vectors, measured no faster on a Zen 4 EPYC built for haswell (docs/design/cpu-paths.md).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

from larql.quant.ir_parts import ir_row, splat
from larql.vindex.topk_kernels import MR, TILE, offer_flagged

QMAX = 63.0  # the feature codes' range each side: c + 64 <= 127 keeps vpmaddubsw's pairs exact
OFFSET = 64
_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_V32I8, _V16I16, _V8I32, _V8F32 = (ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8),
                                   ir.VectorType(_F32, 8))


def token_corr(codes: NDArray[np.int8], tiles: int) -> NDArray[np.int32]:
    """The +64 taken back: -64 x each token's code sum per 32-column block, in the tiles' order:
    out[tile, 32 b + i] for token 32 tile + i (rows past `codes`: 0)."""
    m, hp = codes.shape
    nb = hp // 32
    sums = np.zeros((tiles * TILE, nb), np.int32)
    sums[:m] = codes.reshape(m, nb, 32).sum(axis=2, dtype=np.int32)
    return np.ascontiguousarray((-OFFSET * sums).reshape(tiles, TILE, nb).transpose(0, 2, 1).reshape(tiles, TILE * nb))


def _at(builder, ptr, byte, ty, align=4):  # type: ignore[no-untyped-def]
    """Load a `ty` at byte offset `byte` (an i64 value or int) of an i8* row."""
    off = byte if isinstance(byte, ir.Value) else ir.Constant(_I64, byte)
    return builder.load(builder.gep(ptr, [off], source_etype=_I8), typ=ty, align=align)


@intrinsic
def _micro(typingctx, packed, tsc, tnorm, corr, tile, wcodes, wsc, wterm, f0, vals, masks):  # type: ignore[no-untyped-def]
    """topk_kernels._micro in AVX2: features f0..f0+MR-1 against tile `tile`'s 32 tokens, vals[i, j]
    = A, masks[i] bit j for Y >= T, returns the masks OR-ed. wcodes: the feature codes + 64 (uint8),
    corr: token_corr's.

    Per 32-column block b and step q (4 columns), a 32-byte load holds 8 tokens' 4 codes (signed;
    pack_tokens' order) and the feature's 4 codes are broadcast:

        packed[tile, 1024 b + 128 q + 32 v + 4 i + m] = code 4q + m of token 8v + i   (i < 8, m < 4)

    A block's int32 sums start at corr's and take each step's pairs through vpmaddwd by ones."""
    sig = types.uint32(packed, tsc, tnorm, corr, tile, wcodes, wsc, wterm, f0, vals, masks)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        a = signature.args
        p_row, nb = ir_row(context, builder, a[0], args[0], args[4], 1024)
        s_row, _ = ir_row(context, builder, a[1], args[1], args[4], 4)
        n_row, _ = ir_row(context, builder, a[2], args[2], args[4], 4)
        c_row, _ = ir_row(context, builder, a[3], args[3], args[4], 4)
        feat = [builder.add(args[8], ir.Constant(_I64, i)) for i in range(MR)]
        wc = [ir_row(context, builder, a[5], args[5], feat[i], 1)[0] for i in range(MR)]
        ws = [ir_row(context, builder, a[6], args[6], feat[i], 4)[0] for i in range(MR)]
        wt = [ir_row(context, builder, a[7], args[7], feat[i], 4)[0] for i in range(MR)]
        vrow = [ir_row(context, builder, a[9], args[9], ir.Constant(_I64, i), 4)[0] for i in range(MR)]
        mod = builder.module
        ubsw = cgutils.get_or_insert_function(mod, ir.FunctionType(_V16I16, [_V32I8, _V32I8]), "llvm.x86.avx2.pmadd.ub.sw")
        wd = cgutils.get_or_insert_function(mod, ir.FunctionType(_V8I32, [_V16I16, _V16I16]), "llvm.x86.avx2.pmadd.wd")
        fma = cgutils.get_or_insert_function(mod, ir.FunctionType(_V8F32, [_V8F32] * 3), "llvm.fma.v8f32")
        ones = ir.Constant(_V16I16, [1] * 16)
        mk = context.make_array(a[10])(context, builder, args[10])
        row_bits = [ir.Constant(_I32, 0)] * MR
        for v in range(TILE // 8):  # 8 tokens at a time: MR int32 + MR float32 accumulators, no spills
            acc = [cgutils.alloca_once_value(builder, ir.Constant(_V8F32, None)) for _ in range(MR)]
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                b32 = builder.mul(b, ir.Constant(_I64, 32))
                at8 = builder.mul(builder.add(b32, ir.Constant(_I64, 8 * v)), ir.Constant(_I64, 4))  # byte of (b, v)
                t = [_at(builder, c_row, at8, _V8I32)] * MR  # the block's sums start at -64 x the code sums
                for q in range(8):
                    at = builder.add(builder.mul(b, ir.Constant(_I64, 1024)), ir.Constant(_I64, 128 * q + 32 * v))
                    tok = _at(builder, p_row, at, _V32I8, 1)
                    col = builder.add(b32, ir.Constant(_I64, 4 * q))
                    for i in range(MR):
                        w = builder.bitcast(splat(builder, _at(builder, wc[i], col, _I32, 1), _V8I32), _V32I8)
                        t[i] = builder.add(t[i], builder.call(wd, [builder.call(ubsw, [w, tok]), ones]))
                du = _at(builder, s_row, at8, _V8F32)
                for i in range(MR):
                    dw = splat(builder, _at(builder, ws[i], builder.mul(b, ir.Constant(_I64, 4)), _F32), _V8F32)
                    builder.store(builder.call(fma, [builder.sitofp(t[i], _V8F32), builder.fmul(du, dw),
                                                     builder.load(acc[i])]), acc[i])
            nu, ne = (_at(builder, n_row, 128 * m + 32 * v, _V8F32) for m in range(2))
            for i in range(MR):
                bv, cv, tv = (splat(builder, _at(builder, wt[i], 4 * m, _F32), _V8F32) for m in range(3))
                av = builder.load(acc[i])
                builder.store(av, builder.bitcast(builder.gep(vrow[i], [ir.Constant(_I64, 32 * v)], source_etype=_I8),
                                                  _V8F32.as_pointer()), align=4)
                y = builder.call(fma, [nu, bv, builder.call(fma, [ne, cv, av])])
                m8 = builder.zext(builder.bitcast(builder.fcmp_ordered(">=", y, tv), _I8), _I32)
                row_bits[i] = builder.or_(row_bits[i], builder.shl(m8, ir.Constant(_I32, 8 * v)))
        bits = ir.Constant(_I32, 0)
        for i in range(MR):
            builder.store(row_bits[i], builder.gep(mk.data, [ir.Constant(_I64, i)], source_etype=_I32))
            bits = builder.or_(bits, row_bits[i])
        return bits

    return sig, codegen


@njit(cache=True, parallel=True)
def scan_avx2(packed: NDArray[np.uint8], tsc: NDArray[np.float32], tnorm: NDArray[np.float32],
              corr: NDArray[np.int32], n_tok: int, wcodes: NDArray[np.uint8], wsc: NDArray[np.float32],
              wterm: NDArray[np.float32], tau_: float, lotop: NDArray[np.float64], kf: NDArray[np.float64],
              cand_t: NDArray[np.int32], cand_hi: NDArray[np.float64], cand_n: NDArray[np.int32],
              over: NDArray[np.bool_], panel: int) -> None:  # pragma: no cover - numba
    """topk_kernels.scan_int8 with the AVX2 micro-kernel (wcodes: the 7-bit codes + 64, corr:
    token_corr's): panels of features per thread, every token tile, MR features at a time; flagged
    pairs to offer_flagged."""
    groups = wcodes.shape[0] // MR
    per = panel // MR
    for p in prange((groups + per - 1) // per):
        vals = np.empty((MR, TILE), np.float32)
        masks = np.empty(MR, np.uint32)
        for tile in range(packed.shape[0]):
            for g in range(p * per, min(groups, (p + 1) * per)):
                if _micro(packed, tsc, tnorm, corr, tile, wcodes, wsc, wterm, g * MR, vals, masks) != 0:  # type: ignore[call-arg]
                    offer_flagged(tile, g, vals, masks, n_tok, tnorm, wterm, tau_, lotop, kf, cand_t, cand_hi,
                                  cand_n, over)
