"""A decode step's plain layers, straight from Python to the kernels.

One position through a layer is ~7 matvecs of 20-150 us and a dozen small steps. Forward.layer runs
them through the general machinery (hook checks, norm dispatch, QuantMatrix.matmul's shape checks
and kernel choice, reshapes, temporaries), ~60 us of Python a layer: a fifth of a small model's
token. Here each layer's kernels are chosen once (`DecodeLayers`, made at the first decode step)
and a step calls them directly: the same kernels on the same inputs as the general path, so the
same bits (test), with ~15 calls a layer. Not fused into numba functions: numba compiles a caller
of tuple-typed matrices afresh, which costs a first run more than it saves (docs/design/cpu-paths.md).

A layer qualifies when its block is the plain one: RMS norms, rotary or no positions, a gated MLP
(GELU-tanh or SiLU) with no biases after the q/k/v projections, and every matrix one with a
one-activation kernel (QuantMatrix.vector_kernel: read from its blocks, repacked, or Q8_0's); the
Forward runs the others, and every hooked or edited pass, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.model import fused, prefill_ops
from larql.model.config import ModelConfig
from larql.model.weights import LayerWeights
from larql.quant import kquant_pairs, kquant_rows
from larql.quant.tensor import QuantMatrix

F32 = NDArray[np.float32]
MatVec = Callable[[F32, F32], None]  # (x `[cols]`, out `[rows]`), both float32 C-contiguous
_NO_VEC = np.zeros(1, dtype=np.float32)  # an absent q/k norm's placeholder (decode_qk ignores it)


def matvec(m: QuantMatrix | None) -> MatVec | None:
    """The kernel QuantMatrix.matmul runs for m and one activation, bound to m's weights (None where
    the layer must take the general path: F32 / F16 / BF16 weights)."""
    return None if m is None else m.vector_kernel()


def _pair(a: QuantMatrix | None, b: QuantMatrix | None) -> Callable[[F32, F32, F32], None] | None:
    """a and b's pair kernel (kquant_pairs.py) bound to their blocks: (x, out_a, out_b), the same bits as
    each one's kernel; None unless both are of a type that has one and run its direct kernel (not a
    repacked copy's)."""
    if a is None or b is None or a.qtype != b.qtype or a.n_cols != b.n_cols:
        return None
    kernel, direct = kquant_pairs.PAIR.get(int(a.qtype)), kquant_rows.MATVEC.get(int(a.qtype))
    if kernel is None or any(getattr(m.vector_kernel(), "func", None) is not direct for m in (a, b)):
        return None
    return partial(kernel, a.raw, b.raw)


def _vec(w: F32 | None) -> F32 | None:
    return None if w is None else np.ascontiguousarray(w, dtype=np.float32).reshape(-1)


class DecodeLayers:
    """The layers of one model that a decode step runs by `run`, with their kernels chosen once."""

    def __init__(self, cfg: ModelConfig, layers: tuple[LayerWeights, ...] | list[LayerWeights]) -> None:
        self.cfg, self.activation = cfg, cfg.activation
        # the configuration's scalars as the kernels take them, once (a few us a layer read each step)
        self.eps, self.scale = np.float32(cfg.norm_eps), np.float32(cfg.attn_scale)
        self.softcap = np.float32(cfg.attn_softcap or 0.0)
        self.qk_norm, self.rope, self.interleaved = bool(cfg.qk_norm), cfg.positions == "rope", bool(cfg.rope_interleaved)
        self.windows = [cfg.layer_window(i) for i in range(len(layers))]
        self.args: list[tuple[Any, ...] | None] = [self._gather(lw) for lw in layers]

    def _gather(self, lw: LayerWeights) -> tuple[Any, ...] | None:
        cfg = self.cfg
        if (cfg.norm != "rms" or cfg.positions not in ("rope", "none") or not cfg.gated_mlp
                or cfg.activation not in ("gelu_tanh", "silu") or lw.router is not None or lw.up is None
                or any(b is not None for b in (lw.o_bias, lw.gate_bias, lw.up_bias, lw.down_bias,
                                               lw.attn_norm_bias, lw.ffn_norm_bias))
                or (cfg.qk_norm and (lw.q_norm is None or lw.k_norm is None))
                or (lw.q_bias is not None and (lw.k_bias is None or lw.v_bias is None))):
            return None
        mats = [matvec(m) for m in (lw.q, lw.k, lw.v, lw.o, lw.gate, lw.up, lw.down)]
        if any(m is None for m in mats):
            return None
        pairs = (_pair(lw.q, lw.k), _pair(lw.gate, lw.up))
        sizes = (lw.q.n_rows, lw.k.n_rows, lw.v.n_rows, lw.gate.n_rows if lw.gate is not None else 0)
        norms = (_vec(lw.q_norm) if cfg.qk_norm else _NO_VEC, _vec(lw.k_norm) if cfg.qk_norm else _NO_VEC)
        return (mats, sizes, _vec(lw.q_bias), _vec(lw.k_bias), _vec(lw.v_bias), *norms, _vec(lw.attn_norm),
                _vec(lw.ffn_norm), _vec(lw.post_attn_norm), _vec(lw.post_ffn_norm), pairs)

    def covers(self, i: int) -> bool:
        return self.args[i] is not None

    def run(self, i: int, x: F32, keys: F32, values: F32, pos: int, cos: F32, sin: F32) -> None:
        """Layer i on the residual x `(1, hidden)` float32 C-contiguous, in place, at position `pos`,
        appending its key and value to the cache arrays `(n_kv, capacity, d)`; cos, sin `[d/2]`.
        Forward.layer's operations in its order (decode_attention's two fused calls included). The
        caller ignores floating-point overflow (np.errstate(over="ignore")): SiLU's exp(-x) is inf far
        below 0, and x / inf = 0, as it should be (prefill_ops.gated_mul ignores it per call)."""
        eps, args, window = self.eps, self.args[i], self.windows[i]
        assert args is not None  # run only for a layer `covers`
        (mq, mk, mv, mo, mg, mu, md), (nq, nk, nv, nf), qb, kb, vb, qn, kn, an, fn, pan, pfn, (qk, gu) = args
        d = self.cfg.head_dim
        h = np.empty_like(x)  # (1, hidden)
        fused.rms_norm_rows(x, an, eps, h)
        q, k, v = np.empty(nq, np.float32), np.empty(nk, np.float32), np.empty(nv, np.float32)
        if qk is not None:  # one parallel region for both (kquant_pairs.py)
            qk(h[0], q, k)  # (n_heads*d,), (n_kv*d,)
        else:
            mq(h[0], q)  # (n_heads*d,)
            mk(h[0], k)  # (n_kv*d,)
        mv(h[0], v)  # (n_kv*d,)
        if qb is not None:
            q += qb
            k += kb
            v += vb
        qr = np.empty((nq // d, d), np.float32)  # (n_heads, d) normed, rotated
        fused.decode_qk(q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, d), qn, kn, self.qk_norm, eps, cos, sin,
                        self.rope, self.interleaved, keys, values, pos, qr)
        z = np.empty_like(qr)  # (n_heads, d)
        fused.attend_one(qr, keys, values, max(0, pos - window + 1) if window else 0, pos + 1, self.scale,
                         self.softcap, z)
        a = np.empty_like(x)  # (1, hidden)
        mo(z.reshape(-1), a[0])
        _add(x, a, pan, eps)
        fused.rms_norm_rows(x, fn, eps, h)
        gate, up, t = np.empty(nf, np.float32), np.empty(nf, np.float32), np.empty(nf, np.float32)
        if gu is not None:
            gu(h[0], gate, up)  # (ffn,) each
        else:
            mg(h[0], gate)  # (ffn,)
            mu(h[0], up)  # (ffn,)
        prefill_ops.gated_mul_into(self.activation, gate, up, t)  # act(gate) * up; overflow ignored by the caller
        m = np.empty_like(x)  # (1, hidden)
        md(t, m[0])
        _add(x, m, pfn, eps)


def _add(x: F32, a: F32, weight: F32 | None, eps: np.float32) -> None:
    """x += a, or += rms_norm(a) * weight (forward.add_normed's two cases), in place: the same bits."""
    if weight is None:
        x += a
    else:
        fused.add_rms_norm_rows(x, a, weight, eps, x)
