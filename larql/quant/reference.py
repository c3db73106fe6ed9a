"""Numpy reference dequantizers, one per type, each under a diagram of its block layout.

These are the readable definition of every format; the numba kernels in `kernels.py` must give the
same float32 bits (tests check both against `gguf.quants.dequantize` on every real tensor). Every
function takes blocks as uint8 `[n_blocks, type_size]` and returns float32 `[n_blocks, block_size]`.
The order of float operations is part of the definition: `(d * sc) * q - (dmin * m)` rounds
differently from `d * (sc * q) - ...`, so keep it as written.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from larql.quant.types import BLOCK_LAYOUT, GGMLType

U8 = NDArray[np.uint8]
F32 = NDArray[np.float32]


def _f16(raw: U8) -> F32:
    """Little-endian f16 bytes `[n, 2]` -> float32 `[n, 1]`."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


# F32 / F16 / BF16 -----------------------------------------------------------------------------
# BF16 is the top half of an f32:  [sign | 8 exponent | 7 mantissa] -> append 16 zero bits.


def dequantize_f32(blocks: U8) -> F32:
    return np.ascontiguousarray(blocks).view(np.float32).reshape(-1, 1)


def dequantize_f16(blocks: U8) -> F32:
    return _f16(blocks).reshape(-1, 1)


def dequantize_bf16(blocks: U8) -> F32:
    wide = np.ascontiguousarray(blocks).view(np.uint16).astype(np.uint32) << 16
    return wide.view(np.float32).reshape(-1, 1)


def to_bf16(x: F32) -> NDArray[np.uint16]:
    """float32 -> bf16 bits, rounded to nearest even as torch does (numpy has no bf16 dtype).

    Adding 0x7FFF plus the lowest kept bit before truncating rounds half to even; NaNs keep a set
    mantissa bit so they stay NaN (the carry could otherwise turn them into infinities).
    """
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded).astype(np.uint16)


# Q4_0: 32 weights in 18 bytes, w = d * (q - 8)
#   byte 0-1   d (f16)
#   byte 2-17  qs[j] = HHHH LLLL   L -> weight j, H -> weight j+16   (j = 0..15)


def dequantize_q4_0(blocks: U8) -> F32:
    d = _f16(blocks[:, 0:2])
    q = np.concatenate([blocks[:, 2:18] & 0x0F, blocks[:, 2:18] >> 4], axis=1)
    return d * (q.astype(np.int8) - np.int8(8)).astype(np.float32)


# Q4_1: 32 weights in 20 bytes, w = d * q + m
#   byte 0-1 d (f16) | byte 2-3 m (f16) | byte 4-19 nibbles as Q4_0


def dequantize_q4_1(blocks: U8) -> F32:
    d, m = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    q = np.concatenate([blocks[:, 4:20] & 0x0F, blocks[:, 4:20] >> 4], axis=1)
    return d * q.astype(np.float32) + m


# Q5_0: 32 weights in 22 bytes, w = d * (q - 16) with q = 5 bits
#   byte 0-1   d (f16)
#   byte 2-5   qh: little-endian u32, bit j is the 5th bit of weight j (j = 0..31)
#   byte 6-21  low 4 bits as Q4_0: qs[j] low nibble -> weight j, high nibble -> weight j+16


def _fifth_bits(qh_bytes: U8) -> U8:
    """qh `[n, 4]` -> `[n, 32]` of 0/1, weight j taking bit j of the little-endian u32."""
    return np.unpackbits(np.ascontiguousarray(qh_bytes), axis=1, bitorder="little")


def dequantize_q5_0(blocks: U8) -> F32:
    d = _f16(blocks[:, 0:2])
    low = np.concatenate([blocks[:, 6:22] & 0x0F, blocks[:, 6:22] >> 4], axis=1)
    q = low | (_fifth_bits(blocks[:, 2:6]) << 4)
    return d * (q.astype(np.int8) - np.int8(16)).astype(np.float32)


# Q5_1: 32 weights in 24 bytes, w = d * q + m
#   byte 0-1 d | byte 2-3 m | byte 4-7 qh (as Q5_0) | byte 8-23 low nibbles (as Q5_0)


def dequantize_q5_1(blocks: U8) -> F32:
    d, m = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    low = np.concatenate([blocks[:, 8:24] & 0x0F, blocks[:, 8:24] >> 4], axis=1)
    q = low | (_fifth_bits(blocks[:, 4:8]) << 4)
    return d * q.astype(np.float32) + m


# Q8_0: 32 weights in 34 bytes, w = q * d
#   byte 0-1 d (f16) | byte 2-33 q (int8)


def dequantize_q8_0(blocks: U8) -> F32:
    d = _f16(blocks[:, 0:2])
    return np.ascontiguousarray(blocks[:, 2:34]).view(np.int8).astype(np.float32) * d


# K-quant scales (Q4_K, Q5_K): 8 sub-blocks of 32 weights, each with a 6-bit scale and 6-bit min,
# packed in 12 bytes. Upper-case letters are the scales' bits, lower-case the mins':
#    0 EEAAAAAA    4 eeaaaaaa    8 eeeeEEEE
#    1 FFBBBBBB    5 ffbbbbbb    9 ffffFFFF
#    2 GGCCCCCC    6 ggcccccc   10 ggggGGGG
#    3 HHDDDDDD    7 hhdddddd   11 hhhhHHHH
# sub-blocks 0-3 are A-D/a-d (6 bits in place); 4-7 are E-H/e-h (4 low bits in bytes 8-11,
# 2 high bits in the top of bytes 0-3 / 4-7).


def k_scale_min(scales: U8) -> tuple[U8, U8]:
    """Packed 12-byte scales `[n, 12]` -> (scale `[n, 8]`, min `[n, 8]`) as 6-bit integers."""
    a, b, c = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)], axis=1)
    mn = np.concatenate([b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)], axis=1)
    return sc, mn


def _k_nibbles(qs: U8) -> U8:
    """Q4_K/Q5_K low bits `[n, 128]` -> `[n, 256]`: each 32-byte chunk c holds sub-block 2c in its
    low nibbles and sub-block 2c+1 in its high nibbles."""
    n = qs.shape[0]
    chunks = qs.reshape(n, 4, 1, 32)
    return np.concatenate([chunks & 0x0F, chunks >> 4], axis=2).reshape(n, 256)


def _k_apply(blocks: U8, q: U8) -> F32:
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, mn = k_scale_min(blocks[:, 4:16])
    scale = np.repeat(d * sc.astype(np.float32), 32, axis=1)  # (n, 256)
    shift = np.repeat(dmin * mn.astype(np.float32), 32, axis=1)  # (n, 256)
    return scale * q.astype(np.float32) - shift


# Q4_K: 256 weights in 144 bytes, w = (d * sc[s]) * q - (dmin * m[s]),  s = sub-block (32 weights)
#   byte 0-1 d | 2-3 dmin | 4-15 scales (above) | 16-143 qs (4-bit, see _k_nibbles)


def dequantize_q4_k(blocks: U8) -> F32:
    return _k_apply(blocks, _k_nibbles(blocks[:, 16:144]))


# Q5_K: 256 weights in 176 bytes, as Q4_K plus a fifth bit:
#   byte 0-1 d | 2-3 dmin | 4-15 scales | 16-47 qh | 48-175 qs
#   qh[i] bit s is the fifth bit of weight 32*s + i.


def dequantize_q5_k(blocks: U8) -> F32:
    n = blocks.shape[0]
    bits = np.unpackbits(blocks[:, 16:48], axis=1, bitorder="little").reshape(n, 32, 8)
    high = bits.transpose(0, 2, 1).reshape(n, 256)  # weight 32*s+i <- bit s of qh[i]
    return _k_apply(blocks, _k_nibbles(blocks[:, 48:176]) | (high << np.uint8(4)))


# Q6_K: 256 weights in 210 bytes, w = (d * sc[e // 16]) * (q - 32), q = 6 bits
#   byte 0-127   ql: low 4 bits     byte 128-191 qh: high 2 bits
#   byte 192-207 sc: int8 scales of 16-weight groups      byte 208-209 d (f16)
# Weight e, with half h = e // 128, t = (e % 128) // 32, c = e % 32:
#   low  = ql[64h + 32(t % 2) + c] >> (4 * (t // 2)) & 0xF
#   high = qh[32h + c] >> (2t) & 0x3


def dequantize_q6_k(blocks: U8) -> F32:
    n = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(n, 2, 1, 64)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(n, 2, 4, 32)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = (low | (high << 4)).reshape(n, 256).astype(np.int8) - np.int8(32)
    sc = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
    d = _f16(blocks[:, 208:210])
    return np.repeat(d * sc, 16, axis=1) * q.astype(np.float32)


DEQUANTIZE = {
    GGMLType.F32: dequantize_f32,
    GGMLType.F16: dequantize_f16,
    GGMLType.BF16: dequantize_bf16,
    GGMLType.Q4_0: dequantize_q4_0,
    GGMLType.Q4_1: dequantize_q4_1,
    GGMLType.Q5_0: dequantize_q5_0,
    GGMLType.Q5_1: dequantize_q5_1,
    GGMLType.Q8_0: dequantize_q8_0,
    GGMLType.Q4_K: dequantize_q4_k,
    GGMLType.Q5_K: dequantize_q5_k,
    GGMLType.Q6_K: dequantize_q6_k,
}


def dequantize_reference(raw: U8, qtype: GGMLType, n_cols: int) -> F32:
    """Raw rows `[n_rows, row_bytes]` -> float32 `[n_rows, n_cols]` with the numpy reference."""
    _, type_size = BLOCK_LAYOUT[qtype]
    blocks = np.ascontiguousarray(raw).reshape(-1, type_size)
    return DEQUANTIZE[qtype](blocks).reshape(-1, n_cols)
