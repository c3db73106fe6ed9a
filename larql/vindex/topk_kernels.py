"""down_meta's exact top-k tokens per feature, through a bounded int8 pass and exact rescoring.

For every feature w (a row of W_down^T, `hidden` values) and every token row u of the unembedding U,
down_meta keeps the k largest scores u . w. The exact scan is one float32 GEMM per layer (2,048 x
262,144 x 640 on Gemma 3 270M), compute-bound. With AVX-512 VNNI both sides are quantized per 32
values (an int8 code and a float32 scale per block, like Q8_0, so a Q8_0 unembedding is reproduced
exactly) and a register-blocked int8 GEMM (vpdpbusd: 64 products per instruction, 4x float32's
FMA rate) scores every pair approximately: A, with a proven bound E on |A - F|, F the exact score
rounded to float32:

  A   = sum_b du_b dw_b t_b          (t_b: a block's int32 dot, exact; float32 fma chain over the
                                      nb blocks: |A - u^.w^| <= g ||u^|| ||w^|| + tau, g = 1.01 (nb+1) 2^-24)
  |u^.w^ - u.w| <= ||u|| ||w - w^|| + ||u - u^|| ||w^||            (Cauchy-Schwarz, norms per row)
  |F - u.w|     <= 2^-23 ||u|| ||w|| + 2^-150                      (float64 sum, rounded to float32)
  E   = (||u|| B_f + ||u - u^|| C_f) (1 + 1e-9) + 2^-50 |A| + tau,
        B_f = ||w - w^|| + g ||w^|| + 2^-23 ||w||,  C_f = (1 + g) ||w^||   (||u^|| <= ||u|| + ||u - u^||)

tau covers underflow. Tokens arrive in id order; per feature the k largest A - E so far give L, a
lower bound of the k-th best F among earlier (lower) ids; a token with A + E <= L cannot be in the
top k (k lower ids score at least as much, and an equal score never displaces a lower id), the
others are candidates. At the end the candidates with A + E >= the final L are rescored exactly
(float64 sum of float32 products, rounded to float32) and ranked by (score desc, id asc). The
kernel's own test is float32 and only a screen: it flags A + E >= T, T = L - kf rounded down, kf
(~2^-20 of the largest |A| + E) above its float32 rounding, so it passes every token that the
float64 test in _offer, which decides, would keep.

On the avx2 tier (larql.quant.isa) topk_avx2's kernel forms A from the same token codes and
7-bit feature codes (quantize_blocks' qmax 63): the same bound with their ||w - w^||, about twice
the 8-bit one, so more candidates, the same answers. On the float32 tier A is a float32 sgemm per
vocabulary chunk, E = ||u|| ||w|| (1.01 h 2^-24 + 2^-23) + tau, and the same candidate logic
applies: every path gives the same bits.
A feature whose candidates outgrow their buffer (many tokens within E of its k-th score) goes
again with a wider one, then through the float32 pass, then is scored exactly over the whole
vocabulary (topk.top_tokens).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

from larql.quant.argmax import ir_row

MR = 4  # features per micro-tile (broadcast); with 2 x 16 tokens: 8 int32 + 8 float32 accumulators
TILE = 32  # tokens per micro-tile: two 16-lane vectors
CAP = 512  # candidate slots per feature before compaction
_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_V64I8, _V16I32, _V16F32 = ir.VectorType(_I8, 64), ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)


def tau(h: int) -> float:
    """The bound's absolute term: rounding of subnormal products and sums (<= 2^-150 each, a block's
    scale product's times its int32 dot < 2^20), over far more operations than either pass does."""
    return (h + 64) * 2.0 ** -128


@njit(cache=True, parallel=True)
def quantize_blocks(x: NDArray[np.float32], codes: NDArray[np.int8], scales: NDArray[np.float32],
                    norm: NDArray[np.float64], err: NDArray[np.float64], hat: NDArray[np.float64],
                    qmax: float = 127.0) -> None:  # pragma: no cover - numba
    """Rows of x as int8 codes times a scale per 32 columns (d = max|block| / qmax, codes in
    -qmax..qmax: 127, or 63 for the AVX2 pass's feature codes; codes and scales padded with zeros
    past x's columns). norm, err, hat: ||x||, ||x - x^||, ||x^|| per row in float64 (products
    exact), rounded up."""
    n, h = x.shape
    for r in prange(n):
        n2, e2, h2 = 0.0, 0.0, 0.0
        for b in range(scales.shape[1]):
            top = np.float32(0.0)
            for j in range(32 * b, min(h, 32 * b + 32)):
                top = max(top, abs(x[r, j]))
            d = top / np.float32(qmax)
            scales[r, b] = d
            inv = 1.0 / np.float64(d) if d > 0 else 0.0
            for j in range(32 * b, 32 * b + 32):
                v = np.float64(x[r, j]) if j < h else 0.0
                c = min(max(np.rint(v * inv), -qmax), qmax)
                codes[r, j] = np.int8(c)
                q = c * np.float64(d)
                n2 += v * v
                e2 += (v - q) * (v - q)
                h2 += q * q
        norm[r], err[r], hat[r] = np.sqrt(n2) * (1 + 1e-12), np.sqrt(e2) * (1 + 1e-12), np.sqrt(h2) * (1 + 1e-12)


@njit(cache=True, parallel=True)
def pack_tokens(codes: NDArray[np.int8], scales: NDArray[np.float32], packed: NDArray[np.uint8],
                tscales: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """Token codes in the micro-kernel's order, 32 tokens (a tile) at a time:

        packed[tile, 1024 b + 128 q + 4 i + m] = codes[32 tile + i, 32 b + 4 q + m] + 128  (uint8)
        tscales[tile, 32 b + i]                = scales[32 tile + i, b]

    so one 64-byte load holds 16 tokens' 4 consecutive codes, what vpdpbusd multiplies lane by lane
    with a feature's 4 codes (broadcast); vpdpbusd wants these unsigned, hence the +128 (taken back
    through the feature's block sums). Rows past the vocabulary are code 0 (128), scale 0."""
    n, hp = codes.shape
    nb = hp // 32
    for tile in prange(packed.shape[0]):
        for i in range(TILE):
            t = TILE * tile + i
            for b in range(nb):
                tscales[tile, 32 * b + i] = scales[t, b] if t < n else np.float32(0.0)
                for q in range(8):
                    for m in range(4):
                        c = codes[t, 32 * b + 4 * q + m] if t < n else np.int8(0)
                        packed[tile, 1024 * b + 128 * q + 4 * i + m] = np.uint8(np.int32(c) + 128)


def _vec_at(builder, ptr, index, ty):  # type: ignore[no-untyped-def]
    """Load a vector of type ty from element `index` of a float32/int32 row pointer (i8* bytes)."""
    return builder.load(builder.gep(ptr, [builder.mul(index, ir.Constant(_I64, 4))], source_etype=_I8), typ=ty, align=4)


def _splat(builder, scalar, ty):  # type: ignore[no-untyped-def]
    v = builder.insert_element(ir.Constant(ty, None), scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, ty.count), None))


@intrinsic
def _micro(typingctx, packed, tsc, tnorm, tile, wcodes, wsc, wcorr, wterm, f0, vals, masks):  # type: ignore[no-untyped-def]
    """Features f0..f0+MR-1 against tile `tile`'s 32 tokens: vals[i, j] = A (float32), masks[i] the
    bits of Y >= T (bit j: token j), and returns the masks OR-ed, Y = A + ||u_j|| B_i + ||u_j - u^_j|| C_i, (B, C, T) =
    wterm[f0 + i, 0:3] and tnorm[tile] = (||u|| for the 32 tokens, then ||u - u^||).

    Per 32-column block b (8 steps of 4 columns): t = wcorr[f, b] (-128 x the feature's block code
    sum: the tokens' +128 taken back) plus 8 vpdpbusd, exact in int32; then A += float(t) x (the
    tokens' block scales x the feature's), one fma. Registers: MR x 2 int32 and MR x 2 float32
    accumulators, the 2 token vectors, the broadcasts."""
    sig = types.uint32(packed, tsc, tnorm, tile, wcodes, wsc, wcorr, wterm, f0, vals, masks)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        a = signature.args
        p_row, nb = ir_row(context, builder, a[0], args[0], args[3], 1024)
        s_row, _ = ir_row(context, builder, a[1], args[1], args[3], 4)
        n_row, _ = ir_row(context, builder, a[2], args[2], args[3], 4)
        wc = [ir_row(context, builder, a[4], args[4], builder.add(args[8], ir.Constant(_I64, i)), 1)[0] for i in range(MR)]
        ws = [ir_row(context, builder, a[5], args[5], builder.add(args[8], ir.Constant(_I64, i)), 4)[0] for i in range(MR)]
        wk = [ir_row(context, builder, a[6], args[6], builder.add(args[8], ir.Constant(_I64, i)), 4)[0] for i in range(MR)]
        wt = [ir_row(context, builder, a[7], args[7], builder.add(args[8], ir.Constant(_I64, i)), 4)[0] for i in range(MR)]
        vrow = [ir_row(context, builder, a[9], args[9], ir.Constant(_I64, i), 4)[0] for i in range(MR)]
        dp = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16I32, [_V16I32, _V64I8, _V64I8]),
                                            "llvm.x86.avx512.vpdpbusd.512")
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16F32, [_V16F32] * 3), "llvm.fma.v16f32")
        acc = [[cgutils.alloca_once_value(builder, ir.Constant(_V16F32, None)) for _ in range(2)] for _ in range(MR)]
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            t = [[_splat(builder, builder.load(builder.gep(wk[i], [builder.mul(b, ir.Constant(_I64, 4))], source_etype=_I8),
                                                typ=_I32), _V16I32)] * 2 for i in range(MR)]
            for q in range(8):
                base = builder.add(builder.mul(b, ir.Constant(_I64, 1024)), ir.Constant(_I64, 128 * q))
                tok = [builder.load(builder.gep(p_row, [builder.add(base, ir.Constant(_I64, 64 * j))], source_etype=_I8),
                                    typ=_V64I8, align=1) for j in range(2)]
                col = builder.add(builder.mul(b, ir.Constant(_I64, 32)), ir.Constant(_I64, 4 * q))
                for i in range(MR):
                    w4 = builder.load(builder.gep(wc[i], [col], source_etype=_I8), typ=_I32, align=1)
                    w = builder.bitcast(_splat(builder, w4, _V16I32), _V64I8)
                    t[i] = [builder.call(dp, [t[i][j], tok[j], w]) for j in range(2)]
            du = [_vec_at(builder, s_row, builder.add(builder.mul(b, ir.Constant(_I64, 32)), ir.Constant(_I64, 16 * j)),
                          _V16F32) for j in range(2)]
            for i in range(MR):
                dw = _splat(builder, builder.load(builder.gep(ws[i], [builder.mul(b, ir.Constant(_I64, 4))],
                                                              source_etype=_I8), typ=_F32), _V16F32)
                for j in range(2):
                    sc = builder.fmul(du[j], dw)
                    builder.store(builder.call(fma, [builder.sitofp(t[i][j], _V16F32), sc, builder.load(acc[i][j])]),
                                  acc[i][j])
        mk = context.make_array(a[10])(context, builder, args[10])
        bits = ir.Constant(_I32, 0)
        norms = [[_vec_at(builder, n_row, ir.Constant(_I64, 32 * m + 16 * j), _V16F32) for j in range(2)] for m in range(2)]
        for i in range(MR):
            bv, cv, tv = (_splat(builder, builder.load(builder.gep(wt[i], [ir.Constant(_I64, 4 * m)], source_etype=_I8),
                                                       typ=_F32), _V16F32) for m in range(3))
            row_bits = ir.Constant(_I32, 0)
            for j in range(2):
                av = builder.load(acc[i][j])
                builder.store(av, builder.bitcast(builder.gep(vrow[i], [ir.Constant(_I64, 64 * j)], source_etype=_I8),
                                                  _V16F32.as_pointer()), align=4)
                y = builder.call(fma, [norms[0][j], bv, builder.call(fma, [norms[1][j], cv, av])])
                m16 = builder.zext(builder.bitcast(builder.fcmp_ordered(">=", y, tv), _I16), _I32)
                row_bits = builder.or_(row_bits, builder.shl(m16, ir.Constant(_I32, 16 * j)))
            builder.store(row_bits, builder.gep(mk.data, [ir.Constant(_I64, i)], source_etype=_I32))
            bits = builder.or_(bits, row_bits)
        return bits

    return sig, codegen


@njit(cache=True)
def _below(v: float) -> np.float32:  # pragma: no cover - numba
    """A float32 at most v (the screen's threshold must never exceed the float64 one)."""
    if v > 3.2e38:
        return np.float32(3.0e38)
    if v < -3.2e38:
        return np.float32(-np.inf)
    return np.float32(v - abs(v) * 2.0 ** -22 - 2.0 ** -149)


@njit(cache=True)
def _offer(f: int, t: int, a: float, e: float, lotop: NDArray[np.float64], wterm: NDArray[np.float32],
           kf: NDArray[np.float64], cand_t: NDArray[np.int32], cand_hi: NDArray[np.float64],
           cand_n: NDArray[np.int32], over: NDArray[np.bool_]) -> None:  # pragma: no cover - numba
    """Token t (after every lower id) with lo = a - e <= F <= hi = a + e for feature f: a candidate
    when hi > L (L = lotop[f, k-1], the k-th largest lo so far); lo joins lotop; wterm[f, 2], the
    screen's threshold, follows L down by kf[f]. A full candidate buffer drops those below L; more
    than 3/4 left marks the feature `over` (scored exactly later) and stops its recording."""
    k = lotop.shape[1]
    lo, hi = a - e, a + e
    floor = lotop[f, k - 1]
    if not hi > floor:
        return
    if not over[f]:
        n = cand_n[f]
        if n == cand_t.shape[1]:
            m = 0
            for i in range(n):
                if cand_hi[f, i] >= floor:
                    cand_t[f, m], cand_hi[f, m] = cand_t[f, i], cand_hi[f, i]
                    m += 1
            n = m
            over[f] = n > 3 * cand_t.shape[1] // 4
        if not over[f]:
            cand_t[f, n], cand_hi[f, n] = t, hi
            n += 1
        cand_n[f] = n
    if lo > floor:
        j = k - 1
        while j > 0 and lotop[f, j - 1] < lo:
            lotop[f, j] = lotop[f, j - 1]
            j -= 1
        lotop[f, j] = lo
        wterm[f, 2] = _below(lotop[f, k - 1] - kf[f])


@njit(cache=True, parallel=True)
def scan_int8(packed: NDArray[np.uint8], tsc: NDArray[np.float32], tnorm: NDArray[np.float32], n_tok: int,
              wcodes: NDArray[np.int8], wsc: NDArray[np.float32], wcorr: NDArray[np.int32],
              wterm: NDArray[np.float32], tau_: float, lotop: NDArray[np.float64], kf: NDArray[np.float64],
              cand_t: NDArray[np.int32], cand_hi: NDArray[np.float64], cand_n: NDArray[np.int32],
              over: NDArray[np.bool_], panel: int) -> None:  # pragma: no cover - numba
    """The int8 pass over every token tile for every feature. A thread takes a panel of `panel`
    features (their codes stay in L2) and walks the tiles; each tile (20 KB at 640 columns, in L1)
    meets the panel's features MR at a time. Pairs the micro-kernel flags go to offer_flagged."""
    groups = wcodes.shape[0] // MR
    per = panel // MR
    for p in prange((groups + per - 1) // per):
        vals = np.empty((MR, TILE), np.float32)
        masks = np.empty(MR, np.uint32)
        for tile in range(packed.shape[0]):
            for g in range(p * per, min(groups, (p + 1) * per)):
                if _micro(packed, tsc, tnorm, tile, wcodes, wsc, wcorr, wterm, g * MR, vals, masks) != 0:  # type: ignore[call-arg]
                    offer_flagged(tile, g, vals, masks, n_tok, tnorm, wterm, tau_, lotop, kf, cand_t, cand_hi,
                                  cand_n, over)


@njit(cache=True)
def offer_flagged(tile: int, g: int, vals: NDArray[np.float32], masks: NDArray[np.uint32], n_tok: int,
                  tnorm: NDArray[np.float32], wterm: NDArray[np.float32], tau_: float,
                  lotop: NDArray[np.float64], kf: NDArray[np.float64], cand_t: NDArray[np.int32],
                  cand_hi: NDArray[np.float64], cand_n: NDArray[np.int32],
                  over: NDArray[np.bool_]) -> None:  # pragma: no cover - numba
    """The pairs of features g*MR.. and tile `tile`'s tokens that a micro-kernel flagged (masks,
    with their scores A in vals), each with its bound E, to _offer."""
    for i in range(MR):
        f = g * MR + i
        if masks[i] == 0:
            continue
        for j in range(TILE):
            t = tile * TILE + j
            if (masks[i] >> np.uint32(j)) & np.uint32(1) and t < n_tok:
                a = np.float64(vals[i, j])
                e = ((np.float64(tnorm[tile, j]) * wterm[f, 0] + np.float64(tnorm[tile, TILE + j]) * wterm[f, 1])
                     * (1 + 1e-9) + abs(a) * 2.0 ** -50 + tau_)
                _offer(f, t, a, e, lotop, wterm, kf, cand_t, cand_hi, cand_n, over)


@njit(cache=True, parallel=True)
def screen_f32(s: NDArray[np.float32], base: int, unorm: NDArray[np.float32], wterm: NDArray[np.float32],
               tau_: float, lotop: NDArray[np.float64], kf: NDArray[np.float64], cand_t: NDArray[np.int32],
               cand_hi: NDArray[np.float64], cand_n: NDArray[np.int32],
               over: NDArray[np.bool_]) -> None:  # pragma: no cover - numba
    """The float32 pass's screen: scores s `(features, chunk)` (sgemm) of tokens base.., bound
    ||u|| wterm[f, 0]; pairs that may beat the feature's floor go to _offer."""
    for f in prange(s.shape[0]):
        b = wterm[f, 0]
        for c in range(s.shape[1]):
            if s[f, c] + unorm[base + c] * b >= wterm[f, 2]:
                a = np.float64(s[f, c])
                e = np.float64(unorm[base + c]) * np.float64(b) * (1 + 1e-9) + abs(a) * 2.0 ** -50 + tau_
                _offer(f, base + c, a, e, lotop, wterm, kf, cand_t, cand_hi, cand_n, over)


@njit(cache=True)
def _insert(top_ids: NDArray[np.uint32], top_vals: NDArray[np.float32], f: int, v: np.float32,
            t: int) -> None:  # pragma: no cover - numba
    """Token t with exact score v into feature f's top-k (after every lower id): an equal score
    never displaces a lower id."""
    k = top_ids.shape[1]
    if v > top_vals[f, k - 1]:
        j = k - 1
        while j > 0 and top_vals[f, j - 1] < v:
            top_vals[f, j], top_ids[f, j] = top_vals[f, j - 1], top_ids[f, j - 1]
            j -= 1
        top_vals[f, j], top_ids[f, j] = v, t


@njit(cache=True, parallel=True)
def finish(u: NDArray[np.float32], wt: NDArray[np.float32], lotop: NDArray[np.float64], cand_t: NDArray[np.int32],
           cand_hi: NDArray[np.float64], cand_n: NDArray[np.int32], over: NDArray[np.bool_],
           top_ids: NDArray[np.uint32], top_vals: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """Each feature's candidates with hi >= its final floor, scored exactly (float64 sum of the
    float32 products in column order, rounded to float32) in id order into its top-k: sorted by
    score descending, an equal score never displacing a lower id. Features marked `over` are left
    alone. Four candidates are summed side by side: four independent chains, each in its order."""
    k = top_ids.shape[1]
    h = wt.shape[1]
    for f in prange(wt.shape[0]):
        if over[f]:
            continue
        floor = lotop[f, k - 1]
        keep = np.empty(cand_n[f] + 3, np.int32)
        n = 0
        for i in range(cand_n[f]):
            if cand_hi[f, i] >= floor:
                keep[n] = cand_t[f, i]
                n += 1
        for i in range(n, n + 3):
            keep[i] = keep[0] if n else 0  # the tail's spare lanes: any valid row, never inserted
        for i in range(0, n, 4):
            t0, t1, t2, t3 = keep[i], keep[i + 1], keep[i + 2], keep[i + 3]
            a0 = a1 = a2 = a3 = 0.0
            for j in range(h):
                x = np.float64(wt[f, j])
                a0 += np.float64(u[t0, j]) * x
                a1 += np.float64(u[t1, j]) * x
                a2 += np.float64(u[t2, j]) * x
                a3 += np.float64(u[t3, j]) * x
            _insert(top_ids, top_vals, f, np.float32(a0), t0)
            if i + 1 < n:
                _insert(top_ids, top_vals, f, np.float32(a1), t1)
            if i + 2 < n:
                _insert(top_ids, top_vals, f, np.float32(a2), t2)
            if i + 3 < n:
                _insert(top_ids, top_vals, f, np.float32(a3), t3)


@njit(cache=True, parallel=True)
def exact_scores(u: NDArray[np.float32], w: NDArray[np.float32], out: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """out[t] = u[t] . w, float64 sum of the float32 products rounded to float32 (as `finish`)."""
    for t in prange(u.shape[0]):
        acc = 0.0
        for j in range(u.shape[1]):
            acc += np.float64(u[t, j]) * np.float64(w[j])
        out[t] = np.float32(acc)
