"""Quantized tensors: the GGML type table, numpy reference dequantizers and numba kernels.

    types.py         the GGML type table (block size, bytes) and byte-shape helpers
    reference.py     numpy reference dequantizers, each under a diagram of its block layout
    kernels.py       numba byte readers and exact dequantization; dot_kernels.py: matvec and small matmul
    dequant_rows.py  the prefill path's exact dequantizers (vectorized, serial, split between threads)
    tensor.py        QuantMatrix: a weight kept as raw GGUF blocks, with dequantize and matmul
    quantize.py      Q4_K and Q6_K quantizers
    repack.py        decode-speed int8 copies of 4/5/6-bit blocks; matvec_rows.py, q8_0_rows.py: their matvecs
    kquant_rows.py   decode's matvec straight from Q4_K / Q5_K / Q6_K / Q4_0 / Q5_0 blocks (no repacked copy);
                     block_rows.py: the LLVM IR frame of those row kernels; kquant_pairs.py: two matrices
                     of one type (a layer's q and k, gate and up) in one parallel region
    argmax.py        the exact argmax of the lm_head matvec; argmax_tiles.py, topk_tiles.py: its tiled
                     int8 candidate passes; q8_bounds.py: the bounds that make them exact
    ir_parts.py      LLVM IR pieces the hand-written row kernels share
    isa.py           the CPU tier the int8 kernels run (AVX-512 VNNI, AVX2, float32), LARQL_ISA to lower it
"""

from __future__ import annotations

from larql.quant.reference import dequantize_reference
from larql.quant.tensor import QuantMatrix
from larql.quant.types import BLOCK_LAYOUT, GGMLType, ggml_type, row_bytes

__all__ = ["BLOCK_LAYOUT", "GGMLType", "QuantMatrix", "dequantize_reference", "ggml_type", "row_bytes"]
