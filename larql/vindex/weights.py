"""Model weights stored in a vindex (weights.bin + weights.json), as a WeightSource for the runtime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import VindexError
from larql.quant import GGMLType, QuantMatrix, row_bytes
from larql.vindex import layout


class VindexWeightSource:
    """GGUF-named tensors over the memory-mapped weights.bin, as the manifest describes them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        manifest_path = path / layout.MANIFEST_FILE
        try:
            manifest: list[dict[str, Any]] = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as e:
            raise VindexError(f"{manifest_path}: cannot read the weight manifest ({e})") from e
        self._blob = np.memmap(path / layout.WEIGHTS_FILE, dtype=np.uint8, mode="r")
        self._entries = {e["name"]: e for e in manifest}
        for e in manifest:
            try:
                qtype = GGMLType[e["type"]]
            except KeyError:
                raise VindexError(f"{manifest_path}: tensor {e['name']} has unknown type {e['type']!r}") from None
            shape = e["shape"]
            expected = row_bytes(qtype, shape[-1]) * (int(np.prod(shape[:-1])) if len(shape) > 1 else 1)
            if e["nbytes"] != expected or e["offset"] + e["nbytes"] > len(self._blob) or e["offset"] % layout.ALIGNMENT:
                raise VindexError(f"{path / layout.WEIGHTS_FILE}: tensor {e['name']} has a bad size or offset")

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
