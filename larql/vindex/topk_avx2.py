"""down_meta's int8 pass in AVX2 (topk_kernels has the bound): the same packed tokens, feature codes
and float32 steps as the VNNI micro-kernel, so the same scores A, bit for bit; only the int32 block
dots are formed otherwise.

AVX2 has no vpdpbusd. vpmaddubsw multiplies unsigned by signed bytes and adds adjacent pairs into
saturating int16, and vpmaddwd by ones adds those pairs into int32 (llama.cpp's AVX2 int8 dot).
VNNI's unsigned operand, a token code u as u + 128, would saturate here: (u + 128) w, two of them,
reach 64,770. So the tokens are packed signed (topk.prepare: the VNNI packing ^ 0x80) and, as
llama.cpp does, the feature's sign moves across: vpmaddubsw(|w|, vpsignb(u, w)) multiplies |w| <=
127 by sign(w) u, |u| <= 127 (codes are never -128), and a pair sums to at most 2 x 127 x 127 =
32,258 < 2^15: exact. Four products then sit in each int32 lane, as with vpdpbusd, and no +128 is
to be taken back.

Measured on an AVX-512 Zen 4 EPYC with numba built for haswell, this form only ties the float32
sgemm pass (OpenBLAS's Haswell kernel), where the VNNI kernel is ~2.4x faster: each 32 products
cost a broadcast, vpsignb, vpmaddubsw, vpmaddwd and vpaddd where VNNI spends one instruction on 64;
summing two or four vpmaddubsw results in int16 first (narrower feature codes) gained under 10%.
benchmarks/results/tiers.json has the figures.
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

_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_V32I8, _V16I16, _V8I32, _V8F32 = (ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8),
                                   ir.VectorType(_F32, 8))


def _at(builder, ptr, byte, ty, align=4):  # type: ignore[no-untyped-def]
    """Load a `ty` at byte offset `byte` (an i64 value or int) of an i8* row."""
    off = byte if isinstance(byte, ir.Value) else ir.Constant(_I64, byte)
    return builder.load(builder.gep(ptr, [off], source_etype=_I8), typ=ty, align=align)


@intrinsic
def _micro(typingctx, packed, tsc, tnorm, tile, wcodes, wabs, wsc, wterm, f0, vals, masks):  # type: ignore[no-untyped-def]
    """topk_kernels._micro in AVX2, without the +128 correction: features f0..f0+MR-1 against tile
    `tile`'s 32 tokens, vals[i, j] = A, masks[i] bit j for Y >= T, returns the masks OR-ed. wabs:
    |wcodes|, made once per layer (a vpabsb less per product step).

    The tile in four steps of 8 tokens (v), so the accumulators fit AVX2's 16 registers. Per
    32-column block b and step q (4 columns), a 32-byte load holds the 8 tokens' 4 codes (signed;
    pack_tokens' order) and the feature's 4 codes are broadcast:

        packed[tile, 1024 b + 128 q + 32 v + 4 i + m] = code 4q + m of token 8v + i   (i < 8, m < 4)
    """
    sig = types.uint32(packed, tsc, tnorm, tile, wcodes, wabs, wsc, wterm, f0, vals, masks)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        a = signature.args
        p_row, nb = ir_row(context, builder, a[0], args[0], args[3], 1024)
        s_row, _ = ir_row(context, builder, a[1], args[1], args[3], 4)
        n_row, _ = ir_row(context, builder, a[2], args[2], args[3], 4)
        feat = [builder.add(args[8], ir.Constant(_I64, i)) for i in range(MR)]
        wc = [ir_row(context, builder, a[4], args[4], feat[i], 1)[0] for i in range(MR)]
        wa = [ir_row(context, builder, a[5], args[5], feat[i], 1)[0] for i in range(MR)]
        ws = [ir_row(context, builder, a[6], args[6], feat[i], 4)[0] for i in range(MR)]
        wt = [ir_row(context, builder, a[7], args[7], feat[i], 4)[0] for i in range(MR)]
        vrow = [ir_row(context, builder, a[9], args[9], ir.Constant(_I64, i), 4)[0] for i in range(MR)]
        mod = builder.module
        ubsw = cgutils.get_or_insert_function(mod, ir.FunctionType(_V16I16, [_V32I8, _V32I8]), "llvm.x86.avx2.pmadd.ub.sw")
        wd = cgutils.get_or_insert_function(mod, ir.FunctionType(_V8I32, [_V16I16, _V16I16]), "llvm.x86.avx2.pmadd.wd")
        sign = cgutils.get_or_insert_function(mod, ir.FunctionType(_V32I8, [_V32I8, _V32I8]), "llvm.x86.avx2.psign.b")
        fma = cgutils.get_or_insert_function(mod, ir.FunctionType(_V8F32, [_V8F32] * 3), "llvm.fma.v8f32")
        ones = ir.Constant(_V16I16, [1] * 16)
        mk = context.make_array(a[10])(context, builder, args[10])
        row_bits = [ir.Constant(_I32, 0)] * MR
        for v in range(TILE // 8):  # 8 tokens at a time: MR int32 + MR float32 accumulators, no spills
            acc = [cgutils.alloca_once_value(builder, ir.Constant(_V8F32, None)) for _ in range(MR)]
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                t = [ir.Constant(_V8I32, None)] * MR
                for q in range(8):
                    at = builder.add(builder.mul(b, ir.Constant(_I64, 1024)), ir.Constant(_I64, 128 * q + 32 * v))
                    tok = _at(builder, p_row, at, _V32I8, 1)
                    col = builder.add(builder.mul(b, ir.Constant(_I64, 32)), ir.Constant(_I64, 4 * q))
                    for i in range(MR):
                        w = builder.bitcast(splat(builder, _at(builder, wc[i], col, _I32, 1), _V8I32), _V32I8)
                        aw = builder.bitcast(splat(builder, _at(builder, wa[i], col, _I32, 1), _V8I32), _V32I8)
                        pairs = builder.call(ubsw, [aw, builder.call(sign, [tok, w])])
                        t[i] = builder.add(t[i], builder.call(wd, [pairs, ones]))
                du = _at(builder, s_row, builder.add(builder.mul(b, ir.Constant(_I64, 128)), ir.Constant(_I64, 32 * v)), _V8F32)
                for i in range(MR):
                    dw = splat(builder, _at(builder, ws[i], builder.mul(b, ir.Constant(_I64, 4)), _F32), _V8F32)
                    builder.store(builder.call(fma, [builder.sitofp(t[i], _V8F32), builder.fmul(du, dw), builder.load(acc[i])]),
                                  acc[i])
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
def scan_avx2(packed: NDArray[np.uint8], tsc: NDArray[np.float32], tnorm: NDArray[np.float32], n_tok: int,
              wcodes: NDArray[np.int8], wabs: NDArray[np.int8], wsc: NDArray[np.float32], wterm: NDArray[np.float32], tau_: float,
              lotop: NDArray[np.float64], kf: NDArray[np.float64], cand_t: NDArray[np.int32],
              cand_hi: NDArray[np.float64], cand_n: NDArray[np.int32], over: NDArray[np.bool_],
              panel: int) -> None:  # pragma: no cover - numba
    """topk_kernels.scan_int8 with the AVX2 micro-kernel (wabs = |wcodes|, no wcorr): panels of
    features per thread, every token tile, MR features at a time; flagged pairs to offer_flagged."""
    groups = wcodes.shape[0] // MR
    per = panel // MR
    for p in prange((groups + per - 1) // per):
        vals = np.empty((MR, TILE), np.float32)
        masks = np.empty(MR, np.uint32)
        for tile in range(packed.shape[0]):
            for g in range(p * per, min(groups, (p + 1) * per)):
                if _micro(packed, tsc, tnorm, tile, wcodes, wabs, wsc, wterm, g * MR, vals, masks) != 0:  # type: ignore[call-arg]
                    offer_flagged(tile, g, vals, masks, n_tok, tnorm, wterm, tau_, lotop, kf, cand_t, cand_hi,
                                  cand_n, over)
