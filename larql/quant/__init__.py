"""Quantized tensors: the GGML type table, numpy reference dequantizers and numba kernels."""

from __future__ import annotations

from larql.quant.reference import dequantize_reference
from larql.quant.tensor import QuantMatrix
from larql.quant.types import BLOCK_LAYOUT, GGMLType, ggml_type, row_bytes

__all__ = ["BLOCK_LAYOUT", "GGMLType", "QuantMatrix", "dequantize_reference", "ggml_type", "row_bytes"]
