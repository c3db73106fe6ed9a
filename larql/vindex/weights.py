"""Model weights stored in a vindex (weights.bin + weights.json), as a WeightSource for the runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import LarqlError, VindexError
from larql.io.jsonfile import read_json
from larql.quant import GGMLType, QuantMatrix, row_bytes
from larql.vindex import layout

MAX_MANIFEST_BYTES = 64 << 20  # about 100 bytes per tensor; a model has thousands, not millions


class VindexWeightSource:
    """GGUF-named tensors over the memory-mapped weights.bin, as the manifest describes them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        manifest_path = path / layout.MANIFEST_FILE
        # opening the vindex hashed this file against index.json; the checks below catch a writer's
        # mistake (or a vindex opened without that check) before a tensor is mapped
        manifest = read_json(manifest_path, MAX_MANIFEST_BYTES, 4, "weight manifest")
        if not isinstance(manifest, list) or not all(isinstance(e, dict) for e in manifest):
            raise VindexError(f"{manifest_path}: not a list of tensor entries")
        self._blob = np.memmap(path / layout.WEIGHTS_FILE, dtype=np.uint8, mode="r")
        self._entries: dict[str, dict[str, Any]] = {}
        for e in manifest:
            self._check_entry(manifest_path, e)
        end = 0
        for e in sorted(self._entries.values(), key=lambda e: e["offset"]):
            if e["offset"] < end:
                raise VindexError(f"{path / layout.WEIGHTS_FILE}: tensor {e['name']} overlaps the tensor before it; "
                                  f"the manifest {manifest_path.name} is damaged")
            end = e["offset"] + e["nbytes"]

    def _check_entry(self, manifest_path: Path, e: dict[str, Any]) -> None:
        name = e.get("name")
        if not isinstance(name, str) or name in self._entries:
            raise VindexError(f"{manifest_path}: a tensor entry has a missing or repeated name ({name!r})")
        shape, offset, nbytes = e.get("shape"), e.get("offset"), e.get("nbytes")
        if (not isinstance(shape, list) or not 1 <= len(shape) <= 4
                or not all(isinstance(d, int) and d > 0 for d in shape)
                or not isinstance(offset, int) or not isinstance(nbytes, int) or offset < 0):
            raise VindexError(f"{manifest_path}: tensor {name} needs a shape of positive integers, an offset and nbytes")
        try:
            qtype = GGMLType[e["type"]]
        except (KeyError, TypeError):
            raise VindexError(f"{manifest_path}: tensor {name} has unknown type {e.get('type')!r}") from None
        try:
            expected = row_bytes(qtype, shape[-1]) * (int(np.prod(shape[:-1])) if len(shape) > 1 else 1)
        except (LarqlError, KeyError) as err:  # KeyError: a GGML type larql has no block layout for
            raise VindexError(f"{manifest_path}: tensor {name}: cannot size a {qtype.name} tensor ({err})") from err
        if nbytes != expected or offset + nbytes > len(self._blob) or offset % layout.ALIGNMENT:
            raise VindexError(f"{self.path / layout.WEIGHTS_FILE}: tensor {name} has a bad size or offset")
        self._entries[name] = e

    def has(self, name: str) -> bool:
        return name in self._entries

    def matrix(self, name: str) -> QuantMatrix:
        e = self._entries.get(name)
        if e is None:
            raise VindexError(f"{self.path / layout.MANIFEST_FILE}: missing tensor {name}")
        shape = e["shape"]
        n_rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        raw = self._blob[e["offset"]: e["offset"] + e["nbytes"]].reshape(n_rows, -1)
        return QuantMatrix(name, GGMLType[e["type"]], n_rows, int(shape[-1]), raw)

    def vector(self, name: str) -> NDArray[np.float32]:
        return self.matrix(name).dequantize().reshape(-1)
