"""A decode step's layer in two numba calls, where the general path makes ~20 Python calls.

One position through a layer is ~7 matvecs of 20-150 us and a dozen small steps; run from Python
(Forward.layer: norms, projections, biases, the fused attention, residual adds, the FFN's
activation, each a call with its checks, reshapes and temporaries) the glue cost ~60 us a layer:
2 ms of SmolLM2-135M's 10 ms token. Here one numba call runs the layer up to the FFN's activation
and a second the rest, calling the very kernels the general path calls (matvec_rows' and
dot_kernels' matvecs, fused.decode_qk / attend_one / the RMS norms, prefill_ops' activation
parts), so the results are the same bits (test). The activation's tanh / exp stays numpy's
vectorized one between the two calls, as in prefill_ops.gated_mul (numba's scalar libm call
rounds differently and is slower).

A layer qualifies when its block is the plain one: RMS norms, rotary or no positions, a gated MLP
(GELU-tanh or SiLU) with no biases after the q/k/v projections, and every matrix a repacked
(repack.py) or Q8_0 one; the Forward runs the others, and every hooked or edited pass, as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit
from numpy.typing import NDArray

from larql.model import fused, prefill_ops
from larql.model.config import ModelConfig
from larql.model.weights import LayerWeights
from larql.quant import dot_kernels, matvec_rows
from larql.quant.tensor import QuantMatrix
from larql.quant.types import GGMLType

F32 = NDArray[np.float32]
# a matrix's kernel: matvec_rows' three repacked layouts, or dot_kernels' Q8_0 rows
G32, G32_OFFSET, G16, Q8_0 = 0, 1, 2, 3
_NO_U8, _NO_I8 = np.zeros((1, 1), np.uint8), np.zeros((1, 1), np.int8)
_NO_F32, _NO_VEC = np.zeros((1, 1), np.float32), np.zeros(1, np.float32)
# (raw GGUF rows, repacked int8, scale, offset, kernel): the unused parts are the placeholders above
Matrix = tuple[NDArray[np.uint8], NDArray[np.int8], F32, F32, int]


def matrix_args(m: QuantMatrix | None) -> Matrix | None:
    """What `_matvec` needs of m, or None where the layer must take the general path (a type or
    layout neither kernel family takes, or no repacking budget left)."""
    if m is None:
        return None
    if m.qtype == GGMLType.Q8_0 and m.n_cols % 32 == 0 and m.raw.flags.c_contiguous:
        return (m.raw, _NO_I8, _NO_F32, _NO_F32, Q8_0)
    p = m.repacked()
    if p is None:
        return None
    kernel = G16 if p.group == 16 else G32 if p.offset is None else G32_OFFSET
    return (_NO_U8, p.q, p.scale, _NO_F32 if p.offset is None else p.offset, kernel)


@njit(cache=True)
def _matvec(m, x, out):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """out = W x through the kernel QuantMatrix.matmul picks for one activation: the same bits."""
    raw, q, scale, offset, kernel = m
    if kernel == G32:
        matvec_rows.matvec_g32(q, scale, x, out)
    elif kernel == G32_OFFSET:
        matvec_rows.matvec_g32_offset(q, scale, offset, x, out)
    elif kernel == G16:
        matvec_rows.matvec_g16(q, scale, x, out)
    else:  # the raw rows' int8 view and f16 table are unused by this kernel
        dot_kernels.matvec_q8_0(raw, q, _NO_VEC, x, out)


@njit(cache=True)
def _add_normed(x, a, weight, normed, eps):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """x `(1, n)` += a, or += rms_norm(a) * weight (forward.add_normed's two cases), in place."""
    if normed:
        fused.add_rms_norm_rows(x, a, weight, eps, x)
    else:
        for i in range(x.shape[1]):
            x[0, i] = x[0, i] + a[0, i]


@njit(cache=True)
def attention_and_gates(x, attn_norm, eps, wq, wk, wv, wo, bq, bk, bv, biased, q_norm, k_norm, qk_norm,  # type: ignore[no-untyped-def]
                        cos, sin, rope, interleaved, keys, values, pos, first, scale, softcap, post_attn,
                        post_attn_norm, ffn_norm, wg, wu, gelu, gate, up, t):  # pragma: no cover - numba
    """The layer's attention block into the residual x `(1, hidden)` (in place), then its FFN input
    norm and gate / up projections `(ffn,)`, and into t the activation's argument (GELU: the tanh's,
    prefill_ops._gelu_inner; SiLU: -gate) for numpy's tanh / exp."""
    n_kv, d = keys.shape[0], keys.shape[2]
    h = np.empty_like(x)  # (1, hidden)
    fused.rms_norm_rows(x, attn_norm, eps, h)
    q = np.empty(wq[1].shape[0] if wq[4] != Q8_0 else wq[0].shape[0], dtype=np.float32)  # (n_heads*d,)
    k = np.empty(n_kv * d, dtype=np.float32)
    v = np.empty(n_kv * d, dtype=np.float32)
    _matvec(wq, h[0], q)
    _matvec(wk, h[0], k)
    _matvec(wv, h[0], v)
    if biased:
        q += bq
        k += bk
        v += bv
    n_heads = q.shape[0] // d
    qr = np.empty((n_heads, d), dtype=np.float32)  # normed, rotated
    fused.decode_qk(q.reshape(n_heads, d), k.reshape(n_kv, d), v.reshape(n_kv, d), q_norm, k_norm, qk_norm,
                    eps, cos, sin, rope, interleaved, keys, values, pos, qr)
    z = np.empty((n_heads, d), dtype=np.float32)
    fused.attend_one(qr, keys, values, first, pos + 1, scale, softcap, z)
    a = np.empty_like(x)  # (1, hidden)
    _matvec(wo, z.reshape(n_heads * d), a[0])
    _add_normed(x, a, post_attn_norm, post_attn, eps)
    fused.rms_norm_rows(x, ffn_norm, eps, h)
    _matvec(wg, h[0], gate)
    _matvec(wu, h[0], up)
    if gelu:
        prefill_ops._gelu_inner(gate, t)
    else:
        for i in range(gate.shape[0]):
            t[i] = -gate[i]


@njit(cache=True)
def gated_down(x, gate, up, t, gelu, wd, post_ffn, post_ffn_norm, eps):  # type: ignore[no-untyped-def]  # pragma: no cover
    """t (tanh / exp applied) -> act(gate) * up (prefill_ops' outer parts), the down projection, and
    the residual add into x `(1, hidden)`."""
    if gelu:
        prefill_ops._gelu_outer(gate, t, up)
    else:
        prefill_ops._silu_outer(gate, t, up)
    m = np.empty_like(x)  # (1, hidden)
    _matvec(wd, t, m[0])
    _add_normed(x, m, post_ffn_norm, post_ffn, eps)


def _vec(w: F32 | None) -> F32:
    return _NO_VEC if w is None else np.ascontiguousarray(w, dtype=np.float32).reshape(-1)


class DecodeLayers:
    """The layers of one model that a decode step runs in two numba calls each (`run`), with their
    arguments gathered once."""

    def __init__(self, cfg: ModelConfig, layers: tuple[LayerWeights, ...] | list[LayerWeights]) -> None:
        self.cfg = cfg
        self.gelu = cfg.activation == "gelu_tanh"
        self.args: list[tuple[Any, ...] | None] = [self._gather(lw) for lw in layers]

    def _gather(self, lw: LayerWeights) -> tuple[Any, ...] | None:
        cfg = self.cfg
        if (cfg.norm != "rms" or cfg.positions not in ("rope", "none") or not cfg.gated_mlp
                or cfg.activation not in ("gelu_tanh", "silu") or lw.router is not None or lw.up is None
                or any(b is not None for b in (lw.o_bias, lw.gate_bias, lw.up_bias, lw.down_bias,
                                               lw.attn_norm_bias, lw.ffn_norm_bias))
                or (cfg.qk_norm and (lw.q_norm is None or lw.k_norm is None))):
            return None
        mats = [matrix_args(m) for m in (lw.q, lw.k, lw.v, lw.o, lw.gate, lw.up, lw.down)]
        if any(m is None for m in mats):
            return None
        biased = lw.q_bias is not None
        if biased and (lw.k_bias is None or lw.v_bias is None):
            return None
        return (mats, biased, _vec(lw.q_bias), _vec(lw.k_bias), _vec(lw.v_bias), _vec(lw.q_norm), _vec(lw.k_norm),
                _vec(lw.attn_norm), _vec(lw.ffn_norm), lw.post_attn_norm is not None, _vec(lw.post_attn_norm),
                lw.post_ffn_norm is not None, _vec(lw.post_ffn_norm))

    def covers(self, i: int) -> bool:
        return self.args[i] is not None

    def run(self, i: int, x: F32, keys: F32, values: F32, pos: int, cos: F32, sin: F32) -> None:
        """Layer i on the residual x `(1, hidden)` float32 C-contiguous, in place, for the position
        `pos`, appending its key and value to the cache arrays `(n_kv, capacity, d)`; cos, sin `[d/2]`."""
        cfg, gelu = self.cfg, self.gelu
        args = self.args[i]
        assert args is not None  # run only for a layer `covers`
        (wq, wk, wv, wo, wg, wu, wd), biased, bq, bk, bv, qn, kn, an, fn, post_a, pan, post_f, pfn = args
        window = cfg.layer_window(i)
        eps = np.float32(cfg.norm_eps)
        ffn = wg[1].shape[0] if wg[4] != Q8_0 else wg[0].shape[0]
        gate, up, t = np.empty(ffn, np.float32), np.empty(ffn, np.float32), np.empty(ffn, np.float32)
        attention_and_gates(x, an, eps, wq, wk, wv, wo, bq, bk, bv, biased, qn, kn, bool(cfg.qk_norm), cos, sin,
                            cfg.positions == "rope", bool(cfg.rope_interleaved), keys, values, pos,
                            max(0, pos - window + 1) if window else 0, np.float32(cfg.attn_scale),
                            np.float32(cfg.attn_softcap or 0.0), post_a, pan, fn, wg, wu, gelu, gate, up, t)
        if gelu:
            np.tanh(t, out=t)
        else:
            with np.errstate(over="ignore"):  # exp(-x) = inf far below 0: x / inf = 0, as prefill_ops
                np.exp(t, out=t)
        gated_down(x, gate, up, t, gelu, wd, post_f, pfn, eps)
