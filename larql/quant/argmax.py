"""The exact argmax of a Q8_0 matvec (greedy decoding's lm_head) without every exact dot product.

Gemma 3's tied embedding is a 262,144 x 640 Q8_0 lm_head: 178 MB read per token, and the float32
kernel (int8 widened to float, scaled, multiplied) is compute-bound at ~7 ms. Greedy decoding needs
only the index of the largest logit, so it takes two passes:

1. **Candidates.** The activation is quantized as llama.cpp quantizes it (Q8_0: per 32 values an
   int8 and a float32 scale) and every row is scored with int8 x int8 dot products (AVX-512 VNNI,
   `vpdpbusd`, 32 products per instruction): ~4 ms, the memory's pace.
2. **Exact rescoring.** A row whose approximate score A_r could still be the true maximum is
   rescored by the same float32 kernel the full matvec runs (so with the same bits), and the
   largest of those is the answer, ties going to the lower row as in `np.argmax`.

Why the answer is exact: with x̂ the dequantized activation and F_r the float kernel's logit,
  |A_r - w_r·x̂| <= c·|w_r|·|x̂|,  |F_r - w_r·x| <= c·|w_r|·|x|   (rounding, c = 1.01·(n+2)·2^-24)
  |w_r·x̂ - w_r·x| <= |w_r|·|x̂ - x|                               (Cauchy-Schwarz)
so |A_r - F_r| <= E_r = |w_r|·(|x̂ - x| + c·(|x| + |x̂|)). With m = max_r (A_r - E_r) <= max F,
a row with A_r + E_r < m has F_r < max F and is not the argmax; every row the argmax could be (all
tied maxima too) is rescored. |w_r| is computed once per matrix in float64 and rounded up. On
Gemma 3 |x̂ - x| is ~1% of |x|, E_r ~1 logit, and 1-3 rows are rescored.

The VNNI kernel is LLVM IR emitted through a numba intrinsic. On the avx2 tier (larql.quant.isa)
only the tiled pass (argmax_tiles.py) has an int8 form: until the tiled copy is made, and on the
float32 tier always, `argmax_q8_0` is np.argmax of the full float32 matvec.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

from larql.quant import dot_kernels, isa, kernels
from larql.quant.ir_parts import ir_row
from larql.quant.q8_bounds import bound_slack, quantize_q8, rounding

_I8, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
_V32I8, _V8I32, _V8F32 = ir.VectorType(_I8, 32), ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)


def host_has_vnni() -> bool:
    """Whether the int8 passes run their AVX-512 VNNI form (larql.quant.isa's tier)."""
    return isa.TIER == "avx512vnni"


HAVE_VNNI = host_has_vnni()
# the tiled candidate pass (argmax_tiles.py) runs on both int8 tiers; the row pass here only with VNNI
HAVE_TILED = isa.TIER in ("avx2", "avx512vnni")


# LLVM IR pieces the int8 row-dot intrinsics share (here and vindex/knn_kernels.py)
def ir_add_scaled(builder, acc, dots, scale):
    """acc (8 x float32, in memory) += float(dots) (8 x int32) * scale (float32, splat)."""
    splat = builder.insert_element(ir.Constant(_V8F32, None), scale, ir.Constant(_I32, 0))
    splat = builder.shuffle_vector(splat, splat, ir.Constant(_V8I32, None))
    builder.store(builder.fadd(builder.load(acc), builder.fmul(builder.sitofp(dots, _V8F32), splat)), acc)


def ir_sum8(builder, v):
    """v[0] + v[1] + ... + v[7] of 8 x float32, left to right."""
    total = builder.extract_element(v, ir.Constant(_I32, 0))
    for j in range(1, 8):
        total = builder.fadd(total, builder.extract_element(v, ir.Constant(_I32, j)))
    return total


@intrinsic
def _q8_0_row_dot_q8(typingctx, w, r, xu, dx):
    """sum_k d_k * dx[k] * (int8 dot of block k of row r with the activation's int8 block k), float32.

    A Q8_0 block (34 bytes), and the activation as unsigned bytes xu = q + 128:
      byte 0-1  d (f16)         | 2 .. 33  32 x int8 q_w
    vpdpbusd multiplies unsigned by signed bytes, 4 products per int32 lane; the +128 is taken back
    by a second vpdpbusd of 128s with the same weights: dot(q_w, xu) - dot(q_w, 128) = dot(q_w, q_x).
    """
    sig = types.float32(w, r, xu, dx)

    def codegen(context, builder, signature, args):
        w_v, r_v, xu_v, dx_v = args
        xa = context.make_array(signature.args[2])(context, builder, xu_v)
        da = context.make_array(signature.args[3])(context, builder, dx_v)
        row, n_blocks = ir_row(context, builder, signature.args[0], w_v, r_v, 34)
        fnty = ir.FunctionType(_V8I32, [_V8I32, _V32I8, _V32I8])
        dpbusd = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpbusd.256")
        acc = cgutils.alloca_once_value(builder, ir.Constant(_V8F32, None))
        zero = ir.Constant(_V8I32, None)
        c128 = ir.Constant(_V32I8, [ir.Constant(_I8, 128)] * 32)
        with cgutils.for_range(builder, n_blocks) as loop:
            k = loop.index
            block = builder.gep(row, [builder.mul(k, ir.Constant(_I64, 34))], source_etype=_I8)
            d = builder.fpext(builder.load(block, typ=ir.HalfType(), align=1), _F32)
            wv = builder.load(builder.gep(block, [ir.Constant(_I64, 2)], source_etype=_I8), typ=_V32I8, align=1)
            xv = builder.load(builder.gep(xa.data, [builder.mul(k, ir.Constant(_I64, 32))], source_etype=_I8),
                              typ=_V32I8, align=1)
            s = builder.sub(builder.call(dpbusd, [zero, xv, wv]), builder.call(dpbusd, [zero, c128, wv]))
            scale = builder.fmul(d, builder.load(builder.gep(da.data, [k], source_etype=_F32), typ=_F32))
            ir_add_scaled(builder, acc, s, scale)
        return ir_sum8(builder, builder.load(acc))

    return sig, codegen


@njit(cache=True)
def _select(approx, norms, slack):
    """Rows r whose A_r + E_r reaches max(A - E), E_r = norms[r] * slack, ascending."""
    best = -np.inf
    for r in range(approx.shape[0]):
        best = max(best, np.float64(approx[r]) - norms[r] * slack)
    count = 0
    for r in range(approx.shape[0]):
        if np.float64(approx[r]) + norms[r] * slack >= best:
            count += 1
    out = np.empty(count, dtype=np.int64)
    j = 0
    for r in range(approx.shape[0]):
        if np.float64(approx[r]) + norms[r] * slack >= best:
            out[j] = r
            j += 1
    return out


@njit(cache=True, parallel=True)
def q8_0_candidates(w, x, norms, c):
    """The whole candidate pass in one kernel (one compilation: ~1 s on a first run, not ~4 s for
    three): quantize x `[n]`, score every Q8_0 row of w with int8 dots, keep the rows that may be
    the maximum (module docstring), ascending."""
    n = x.shape[0]
    xu = np.empty(n, dtype=np.uint8)
    dx = np.empty(n // 32, dtype=np.float32)
    err, hat = quantize_q8(x, xu, dx)
    slack = bound_slack(x, err, hat, c)
    approx = np.empty(w.shape[0], dtype=np.float32)
    for r in prange(w.shape[0]):
        approx[r] = _q8_0_row_dot_q8(w, r, xu, dx)  # type: ignore[call-arg]
    return _select(approx, norms, slack)


# The pieces alone, for the tests (production compiles only q8_0_candidates).
@njit(cache=True)
def quantize_activation(x, xu, dx):
    return quantize_q8(x, xu, dx)


@njit(cache=True, parallel=True)
def matvec_q8_0_q8(w, xu, dx, out):
    """Approximate logits: every Q8_0 row of w `[rows, bytes]` against the quantized activation."""
    for r in prange(w.shape[0]):
        out[r] = _q8_0_row_dot_q8(w, r, xu, dx)  # type: ignore[call-arg]


def candidate_rows(raw: NDArray[np.uint8], norms: NDArray[np.float64], x: NDArray[np.float32]) -> NDArray[np.int64] | None:
    """The rows that may hold the largest exact logit of raw (Q8_0 `[rows, bytes]`) times x `[n]`,
    ascending; None when x is not finite (the caller then runs the full matvec)."""
    if not np.isfinite(x).all():
        return None
    return q8_0_candidates(raw, x, norms, rounding(x.shape[0]))


class CandidateFinder(Protocol):
    """A faster copy of the matrix that finds the same candidates (argmax_tiles.py Tiled)."""

    def candidates(self, x: NDArray[np.float32], c: float) -> NDArray[np.int64]: ...


def argmax_q8_0(raw: NDArray[np.uint8], norms: NDArray[np.float64] | None, x: NDArray[np.float32],
                tiled: CandidateFinder | None = None) -> int:
    """np.argmax of the float32 Q8_0 matvec raw `[rows, bytes]` times x `[n]`, the same index always;
    norms: `row_norms` of raw (None, or no int8 tier: the full matvec); tiled: raw's argmax_tiles copy
    (the same candidates, found ~2x faster; on the avx2 tier the only int8 pass), if made."""
    tab = kernels.F16_TO_F32
    rows = None
    if HAVE_TILED and norms is not None:
        if tiled is not None and np.isfinite(x).all():
            rows = tiled.candidates(x, rounding(x.shape[0]))
        elif HAVE_VNNI:
            rows = candidate_rows(raw, norms, x)
    if rows is None:
        out = np.empty(raw.shape[0], dtype=np.float32)
        dot_kernels.matvec_q8_0(raw, raw.view(np.int8), tab, x, out)
        return int(np.argmax(out))
    sub = np.ascontiguousarray(raw[rows])
    exact = np.empty(len(rows), dtype=np.float32)
    dot_kernels.matvec_q8_0(sub, sub.view(np.int8), tab, x, exact)  # the full matvec's kernel: the same bits per row
    return int(rows[int(np.argmax(exact))])


def row_norms(raw: NDArray[np.uint8], chunk: int = 8192) -> NDArray[np.float64]:
    """|w_r| of every Q8_0 row, rounded up (float64 `[rows]`), with numpy (no kernel to compile):
    per 34-byte block (byte 0-1 d, f16 | 2..33 32 x int8 q) d² · Σq², exact in float64 (Σq² < 2^20
    is exact even in float32), summed over the blocks."""
    out = np.empty(raw.shape[0], dtype=np.float64)
    for a in range(0, raw.shape[0], chunk):
        blocks = raw[a:a + chunk].reshape(-1, raw.shape[1] // 34, 34)
        d = kernels.F16_TO_F32[np.ascontiguousarray(blocks[:, :, :2]).view(np.uint16)[:, :, 0]].astype(np.float64)
        q = blocks[:, :, 2:].view(np.int8).astype(np.float32)
        out[a:a + chunk] = np.sqrt((d * d * np.einsum("rbi,rbi->rb", q, q).astype(np.float64)).sum(axis=1))
    return out * (1 + 1e-12)


@njit(cache=True, parallel=True)
def topk_update(scores: NDArray[np.float32], base: int, top_ids: NDArray[np.uint32],
                top_vals: NDArray[np.float32]) -> None:  # pragma: no cover - numba
    """Merge scores `(features, chunk)` for tokens base.. into each feature's running top-k.

    Kept sorted by score descending; an equal score never displaces an earlier (lower) token id.
    """
    k = top_ids.shape[1]
    for f in prange(scores.shape[0]):
        threshold = top_vals[f, k - 1]
        for c in range(scores.shape[1]):
            s = scores[f, c]
            if s > threshold:
                j = k - 1
                while j > 0 and top_vals[f, j - 1] < s:
                    top_vals[f, j] = top_vals[f, j - 1]
                    top_ids[f, j] = top_ids[f, j - 1]
                    j -= 1
                top_vals[f, j] = s
                top_ids[f, j] = base + c
                threshold = top_vals[f, k - 1]
