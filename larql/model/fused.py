"""Numba versions of the forward pass's small row-wise steps (RMS norm).

In decode each of these runs on a single 640-2048-float row, where numpy's per-call and
per-temporary overheads cost more than the arithmetic (the six norms of a Gemma layer took 1.5 ms
of an 18 ms token). Same formulas as the numpy definitions in forward.py; the mean of squares is
accumulated in float64 (8 partial sums), which is at least as accurate as numpy's pairwise float32 sum.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

_F32, _F64, _I32, _I64 = ir.FloatType(), ir.DoubleType(), ir.IntType(32), ir.IntType(64)


@intrinsic
def _sum_squares8(typingctx, x):
    """The 8 partial sums of `_sum_squares` over x's first n // 8 * 8 floats, combined as
    ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)), float64: lane j adds float64(x[8i + j])^2
    in order of i. LLVM IR (a numba intrinsic) so that the 8 sums are one vector register: as 8
    scalars (or numba's array of 8) they stayed scalar, one float64 multiply-add per element (a
    prefill's 256 x 640 norm: 47 us of its 77). A multiply then an add, as the scalar code: the
    same bits. x: a C-contiguous float32 row."""
    if not (isinstance(x, types.Array) and x.ndim == 1 and x.layout == "C" and x.dtype == types.float32):
        return None
    sig = types.float64(x)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        n8 = builder.sdiv(cgutils.unpack_tuple(builder, a.shape)[0], ir.Constant(_I64, 8))
        v8f32, v8f64 = ir.VectorType(_F32, 8), ir.VectorType(_F64, 8)
        acc = cgutils.alloca_once_value(builder, ir.Constant(v8f64, None))
        with cgutils.for_range(builder, n8) as loop:
            ptr = builder.gep(a.data, [builder.mul(loop.index, ir.Constant(_I64, 8))], source_etype=_F32)
            v = builder.fpext(builder.load(builder.bitcast(ptr, v8f32.as_pointer()), typ=v8f32, align=4), v8f64)
            builder.store(builder.fadd(builder.load(acc), builder.fmul(v, v)), acc)
        p = [builder.extract_element(builder.load(acc), ir.Constant(_I32, j)) for j in range(8)]
        return builder.fadd(builder.fadd(builder.fadd(p[0], p[1]), builder.fadd(p[2], p[3])),
                            builder.fadd(builder.fadd(p[4], p[5]), builder.fadd(p[6], p[7])))

    return sig, codegen


@njit(cache=True, fastmath=False)
def _sum_squares(x):
    """sum(x*x) of a float32 row in float64, in 8 interleaved partial sums (`_sum_squares8`) and
    the tail: independent additions that run side by side (one running sum waited ~4 cycles per
    element: a prefill's 256 x 640 norm took 0.2 ms), each still exact to float64 rounding."""
    n = x.shape[0]
    tail = 0.0
    for i in range(n // 8 * 8, n):
        v = np.float64(x[i])
        tail += v * v
    return _sum_squares8(x) + tail  # type: ignore[call-arg]


@njit(cache=True, fastmath=False)
def rms_norm_rows(x, weight, eps, out):
    """out[r] = x[r] / rms(x[r]) * weight, for x `[rows, n]` float32."""
    n = x.shape[1]
    for r in range(x.shape[0]):
        inv = np.float32(1.0) / np.sqrt(np.float32(_sum_squares(x[r]) / n) + eps)
        for i in range(n):
            out[r, i] = (x[r, i] * inv) * weight[i]


@njit(cache=True, fastmath=False)
def add_rms_norm_rows(x, a, weight, eps, out):
    """out[r] = x[r] + rms_norm(a[r]) * weight, x, a, out `[rows, n]` float32: a sandwich norm and
    the residual add in one pass (`x + rms_norm_rows(a)`'s operations, so its bits), without the
    normed rows' temporary and numpy's second pass over them."""
    n = a.shape[1]
    for r in range(a.shape[0]):
        inv = np.float32(1.0) / np.sqrt(np.float32(_sum_squares(a[r]) / n) + eps)
        for i in range(n):
            out[r, i] = x[r, i] + (a[r, i] * inv) * weight[i]


@njit(cache=True, fastmath=True)
def _attend_part(q, keys, values, kv, h0, group, a, b, scale, softcap, w, o, top, total):
    """Query heads h0..h0+group-1 of q `(n_heads, d)`, which share key/value head kv, over positions
    a..b-1: o[g] = sum_j exp(s_gj - top[g]) v_j unnormalised, top[g] the largest score s_gj (soft-capped
    where set), total[g] = sum_j exp(s_gj - top[g]); w `(group, >= b - a)` scratch. Each key and value
    row is read once for the whole group; each step is a loop of its own, so that LLVM vectorizes the
    dot products and the weighted sums, and the sums take four value rows a pass (the output row
    stored once per four rows, not once per row)."""
    d = q.shape[1]
    n = b - a
    for j in range(n):
        row = keys[kv, a + j]
        for g in range(group):
            qg = q[h0 + g]
            acc = np.float32(0.0)
            for i in range(d):
                acc += qg[i] * row[i]
            w[g, j] = acc * scale
    if softcap != 0.0:
        for g in range(group):
            for j in range(n):
                w[g, j] = np.tanh(w[g, j] / softcap) * softcap
    for g in range(group):
        best = np.float32(-np.inf)
        for j in range(n):
            best = max(best, w[g, j])
        s = np.float32(0.0)
        for j in range(n):
            e = np.exp(w[g, j] - best)
            w[g, j] = e
            s += e
        top[g], total[g] = best, s
        for i in range(d):
            o[g, i] = np.float32(0.0)
    vv = values[kv]
    n4 = n // 4 * 4
    for j in range(0, n4, 4):
        r = a + j
        for g in range(group):
            p0, p1, p2, p3 = w[g, j], w[g, j + 1], w[g, j + 2], w[g, j + 3]
            og = o[g]
            for i in range(d):
                og[i] += (p0 * vv[r, i] + p1 * vv[r + 1, i]) + (p2 * vv[r + 2, i] + p3 * vv[r + 3, i])
    for j in range(n4, n):
        for g in range(group):
            p = w[g, j]
            for i in range(d):
                o[g, i] += p * vv[a + j, i]


# Each key/value head's positions are cut into ranges of at least PART_MIN positions, at most
# MAX_PARTS of them: a function of the length alone, not of the thread count, so that the same step
# gives the same bits on one thread (a busy machine, busy.py) as on eight.
PART_MIN, MAX_PARTS = 128, 8
# Below this many (position, key/value head) pairs the ranges run on this thread: a parallel region
# costs more than their work (Gemma 3 4B, 4 key/value heads, 26 positions: 9 us on one thread, 88-160
# us on two with the other core busy; every decode step runs one a layer). The same ranges either way,
# so the same bits.
SERIAL_BELOW = 1024


@njit(cache=True, fastmath=True, parallel=True)
def attend_one(q, keys, values, first, stop, scale, softcap, out):
    """One query position (decode) over keys/values `(n_kv, capacity, d)` at positions first..stop-1,
    causal by construction (the cache holds only earlier positions); q and out `(n_heads, d)`.

    Softmax(q.k * scale, optionally soft-capped) then the weighted sum of values, per head, with
    n_heads / n_kv query heads sharing each key/value head. Each key/value head's positions are cut
    into ranges (PART_MIN, MAX_PARTS), the ranges of every head side by side on numba's threads, then
    merged: softmax(s) v = sum_p e^(top_p - top) o_p / sum_p e^(top_p - top) total_p. Each range's
    keys and values are read once for all the query heads that share them (Gemma 3: one key/value
    head, four query heads), in place of a dozen small numpy calls (docs/design/cpu-paths.md)."""
    n_heads, d = q.shape
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    n = stop - first
    parts = max(1, min(MAX_PARTS, n // PART_MIN))
    size = (n + parts - 1) // parts
    tasks = n_kv * parts
    o = np.empty((tasks, group, d), dtype=np.float32)
    top = np.empty((tasks, group), dtype=np.float32)
    total = np.empty((tasks, group), dtype=np.float32)
    w = np.empty((tasks, group, max(size, 1)), dtype=np.float32)
    if n * n_kv < SERIAL_BELOW:
        for t in range(tasks):
            kv, p = t // parts, t % parts
            a = first + p * size
            _attend_part(q, keys, values, kv, kv * group, group, a, min(stop, a + size), scale, softcap, w[t],
                         o[t], top[t], total[t])
    else:
        for t in prange(tasks):
            kv, p = t // parts, t % parts
            a = first + p * size  # < stop: parts <= n // PART_MIN, so every range holds positions
            _attend_part(q, keys, values, kv, kv * group, group, a, min(stop, a + size), scale, softcap, w[t],
                         o[t], top[t], total[t])
    for h in range(n_heads):
        kv, g = h // group, h % group
        best = np.float32(-np.inf)
        for p in range(parts):
            if total[kv * parts + p, g] > 0.0:  # a range whose scores are all -inf adds nothing
                best = max(best, top[kv * parts + p, g])
        s = np.float32(0.0)
        for i in range(d):
            out[h, i] = np.float32(0.0)
        for p in range(parts):
            t = kv * parts + p
            if total[t, g] > 0.0:
                f = np.exp(top[t, g] - best)
                s += total[t, g] * f
                for i in range(d):
                    out[h, i] += o[t, g, i] * f
        inv = np.float32(1.0) / s
        for i in range(d):
            out[h, i] *= inv


@njit(cache=True, fastmath=False)
def _rms_norm_row(x, weight, eps, out):
    """rms_norm_rows of one row, x and out `[n]` (the same operations, so the same bits)."""
    n = x.shape[0]
    inv = np.float32(1.0) / np.sqrt(np.float32(_sum_squares(x) / n) + eps)
    for i in range(n):
        out[i] = (x[i] * inv) * weight[i]


@njit(cache=True, fastmath=False)
def _rope_row(x, cos, sin, interleaved, out):
    """apply_rope of one head `[d]` at one position (cos, sin `[d/2]`): the same products and sums."""
    half = cos.shape[0]
    for i in range(half):
        if interleaved:
            x1, x2 = x[2 * i], x[2 * i + 1]
            out[2 * i] = x1 * cos[i] - x2 * sin[i]
            out[2 * i + 1] = x2 * cos[i] + x1 * sin[i]
        else:
            x1, x2 = x[i], x[half + i]
            out[i] = x1 * cos[i] - x2 * sin[i]
            out[half + i] = x2 * cos[i] + x1 * sin[i]


@njit(cache=True, fastmath=False)
def decode_qk(q, k, v, q_norm, k_norm, qk_norm, eps, cos, sin, rope, interleaved, keys, values, pos, qr):
    """A decode step's attention inputs in one call: q `(n_heads, d)`, k and v `(n_kv, d)` -> optional
    per-head RMS norms (q_norm, k_norm `[d]`) and rotation at position `pos` (cos, sin `[d/2]`); the
    query into qr `(n_heads, d)`, k and v into the cache `(n_kv, capacity, d)` at pos. The forward
    pass's separate steps do the same operations (test: the same bits); this saves ~5 Python calls
    a layer. `attend_one` then runs as its own call: inlined here its fastmath sums could be
    reordered, and the results would differ in the last bits from the general path's."""
    n_heads, d = q.shape
    tmp = np.empty(d, dtype=np.float32)
    for h in range(n_heads + k.shape[0]):
        src = q[h] if h < n_heads else k[h - n_heads]
        if qk_norm:
            _rms_norm_row(src, q_norm if h < n_heads else k_norm, eps, tmp)
        else:
            for i in range(d):
                tmp[i] = src[i]
        dst = qr[h] if h < n_heads else keys[h - n_heads, pos]
        if rope:
            _rope_row(tmp, cos, sin, interleaved, dst)
        else:
            for i in range(d):
                dst[i] = tmp[i]
    for h in range(k.shape[0]):
        for i in range(d):
            values[h, pos, i] = v[h, i]


@njit(cache=True, fastmath=False)
def rope_rows(x, cos, sin, interleaved, out):
    """apply_rope of x `(T, heads, d)` with cos, sin `(T, d/2)` into out: per element the same
    products and sums as the numpy definition, without its four temporaries and a concatenate."""
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            _rope_row(x[t, h], cos[t], sin[t], interleaved, out[t, h])


@njit(cache=True, fastmath=False)
def norm_rope_rows(x, weight, eps, cos, sin, interleaved, out):
    """rms_norm_rows of every head row of x `(T, heads, d)` (weight `[d]`), then rope_rows with cos,
    sin `(T, d/2)`, into out: per row `decode_qk`'s two steps, so the same bits as the two passes,
    without the normed copy between them (a Gemma 3 prefill's q and k: one pass each, not two)."""
    tmp = np.empty(x.shape[2], dtype=np.float32)
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            _rms_norm_row(x[t, h], weight, eps, tmp)
            _rope_row(tmp, cos[t], sin[t], interleaved, out[t, h])
