"""GGUF container reader: one memory map, validated up front, zero-copy tensor views.

Layout (little-endian), GGUF v2/v3:
    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv    x  (string key, u32 value_type, value)
    n_tensors x (string name, u32 n_dims, u64 dims[n_dims] (fastest first), u32 ggml_type, u64 offset)
    padding to `general.alignment` (default 32), then the tensor data; offsets are relative to it.
A string is u64 length + utf-8 bytes; an array is u32 item_type + u64 count + items.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from larql.errors import ModelFormatError
from larql.quant import BLOCK_LAYOUT, GGMLType, QuantMatrix, ggml_type

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# value type -> (struct code, size) for scalars; 8 = string, 9 = array
_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4),
            6: ("f", 4), 7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: GGMLType
    shape: tuple[int, ...]  # numpy order: slowest axis first (GGUF stores fastest first)
    offset: int  # absolute byte offset in the file
    nbytes: int


class _Cursor:
    """Bounds-checked sequential reads; running off the end is a truncated file."""

    def __init__(self, buf: np.ndarray, path: Path) -> None:
        self.buf, self.pos, self.path = memoryview(buf), 0, path  # type: ignore[arg-type]

    def _need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise ModelFormatError(f"{self.path}: truncated GGUF header (needed {n} bytes at offset {self.pos})")

    def take(self, n: int) -> bytes:
        self._need(n)
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def scalar(self, code: str, size: int) -> Any:
        self._need(size)
        value = struct.unpack_from("<" + code, self.buf, self.pos)[0]
        self.pos += size
        return value

    def strings(self, count: int) -> list[str]:
        """`count` strings in a row (a vocabulary): the hot loop of opening a GGUF."""
        buf, pos, end, out = self.buf, self.pos, len(self.buf), []
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > end:
                break
            (n,) = unpack(buf, pos)
            if pos + 8 + n > end:
                break
            out.append(str(buf[pos + 8:pos + 8 + n], "utf-8", "replace"))
            pos += 8 + n
        self.pos = pos
        if len(out) < count:
            self._need(8 + (end - pos) + 1)  # raises: the array runs past the end
        return out

    def string(self) -> str:
        n = self.scalar("Q", 8)
        raw = self.take(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(*_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            item_type, count = self.scalar("I", 4), self.scalar("Q", 8)
            if item_type in _NUMPY:  # numeric arrays in one read (token scores, types)
                dtype = np.dtype(_NUMPY[item_type])
                return np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype).copy()
            if item_type == 8:
                return self.strings(count)
            return [self.value(item_type) for _ in range(count)]
        raise ModelFormatError(f"{self.path}: corrupt GGUF metadata (unknown value type {vtype} at offset {self.pos})")


class GGUFFile:
    """A parsed GGUF file: `metadata` (dict) and `tensors` (name -> TensorInfo) over one memmap."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFormatError(f"{self.path}: no such model file")
        try:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise ModelFormatError(f"{self.path}: cannot map the file ({e})") from e
        cur = _Cursor(self._map, self.path)
        if len(self._map) < 24 or cur.take(4) != GGUF_MAGIC:
            raise ModelFormatError(f"{self.path}: not a GGUF file (bad magic); expected a .gguf model")
        self.version = cur.scalar("I", 4)
        if self.version not in (2, 3):
            raise ModelFormatError(f"{self.path}: GGUF version {self.version} is not supported (2 or 3)")
        n_tensors, n_kv = cur.scalar("Q", 8), cur.scalar("Q", 8)
        if n_tensors > 1_000_000 or n_kv > 1_000_000:
            raise ModelFormatError(f"{self.path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar("I", 4))
        infos = [self._tensor_header(cur) for _ in range(n_tensors)]
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if alignment <= 0 or alignment & (alignment - 1):
            raise ModelFormatError(f"{self.path}: general.alignment {alignment} is not a power of two")
        data_start = -(-cur.pos // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, qtype, shape, rel in infos:
            block_size, type_size = BLOCK_LAYOUT[qtype]
            n_weights = int(np.prod(shape)) if shape else 1
            if shape[-1] % block_size:
                raise ModelFormatError(
                    f"{self.path}: tensor {name} has rows of {shape[-1]} weights, not a multiple "
                    f"of the {qtype.name} block size {block_size}"
                )
            nbytes = n_weights // block_size * type_size
            start = data_start + rel
            if start + nbytes > len(self._map):
                raise ModelFormatError(
                    f"{self.path}: truncated file: tensor {name} needs bytes {start}..{start + nbytes} "
                    f"but the file has {len(self._map)}"
                )
            if name in self.tensors:
                raise ModelFormatError(f"{self.path}: duplicate tensor {name}")
            self.tensors[name] = TensorInfo(name, qtype, shape, start, nbytes)

    def _tensor_header(self, cur: _Cursor) -> tuple[str, GGMLType, tuple[int, ...], int]:
        name = cur.string()
        n_dims = cur.scalar("I", 4)
        if not 1 <= n_dims <= 4:
            raise ModelFormatError(f"{self.path}: corrupt tensor header for {name!r} ({n_dims} dims)")
        dims = [cur.scalar("Q", 8) for _ in range(n_dims)]
        qtype = ggml_type(cur.scalar("I", 4), where=f"{self.path}: tensor {name}")
        offset = cur.scalar("Q", 8)
        return name, qtype, tuple(reversed(dims)), offset

    def has(self, name: str) -> bool:
        return name in self.tensors

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a zero-copy uint8 view."""
        info = self.tensor_info(name)
        return self._map[info.offset:info.offset + info.nbytes]

    def tensor_info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelFormatError(f"{self.path}: missing tensor {name}") from None

    def matrix(self, name: str) -> QuantMatrix:
        """A 2-D (or 1-D, as one row) tensor as a QuantMatrix over the memory map."""
        info = self.tensor_info(name)
        n_cols = info.shape[-1]
        n_rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        return QuantMatrix(name, info.qtype, n_rows, n_cols, self.raw(name).reshape(n_rows, -1))

    def vector(self, name: str) -> np.ndarray:
        """A small tensor (norm weights) dequantized to float32 `[n]`."""
        return self.matrix(name).dequantize().reshape(-1)
