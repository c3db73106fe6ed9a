"""The patch operation of a ROME / MEMIT weight edit: a low-rank addition to one layer's down
projection, with the facts it teaches and the keys it maps (format: vindex_spec/EDITING.md)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.edit.patches.delta import LowRankDelta
from larql.edit.patches.overlay import PatchOverlay
from larql.errors import VindexError

F32 = NDArray[np.float32]
FACT_FIELDS = ("subject", "relation", "prompt", "target")
MAX_RANK = 100_000


def f32_b64(a: NDArray[np.floating]) -> str:
    """A vector or matrix as .vlp stores it: little-endian float32 bytes, base64."""
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode()


def _unb64(text: Any, shape: tuple[int, int], where: str, name: str) -> F32:
    if not isinstance(text, str):
        raise VindexError(f"{where}: {name}_b64 must be a base64 string")
    if len(text) > 4 * (4 * shape[0] * shape[1] + 2) // 3 + 4:  # refused before decoding
        raise VindexError(f"{where}: {name} holds more than {shape[0]} x {shape[1]} values (a patch for another model?)")
    try:
        raw = base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error) as e:
        raise VindexError(f"{where}: {name}_b64 is not base64 ({e})") from None
    if len(raw) != 4 * shape[0] * shape[1]:
        raise VindexError(f"{where}: {name} holds {len(raw) // 4} values, expected {shape[0]} x {shape[1]} "
                          f"(a patch for another model?)")
    arr = np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(shape)
    if not np.all(np.isfinite(arr)):
        raise VindexError(f"{where}: {name} has NaN or infinite values")
    return arr


@dataclass(frozen=True)
class WeightOp(LowRankDelta):
    """A low-rank delta as a patch operation: the facts it teaches and the method that solved it."""

    facts: tuple[dict[str, str], ...] = ()
    method: str = "rome"
    op: str = "weight_edit"
    feature: int = -1  # not a feature edit: no slot is written

    def apply(self, overlay: PatchOverlay) -> None:
        overlay.add_weight(self.layer, self.u, self.v, self.keys)

    def labels(self) -> list[str]:
        return [f"{f.get('subject', '?')} -[{f.get('relation') or '?'}]-> {f.get('target', '?')}" for f in self.facts]

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "layer": self.layer, "method": self.method, "rank": self.rank,
                "u_b64": f32_b64(self.u), "v_b64": f32_b64(self.v), "keys_b64": f32_b64(self.keys),
                "facts": [dict(f) for f in self.facts]}

    @staticmethod
    def from_json(d: dict[str, Any], where: str, hidden: int, ffn: int, num_layers: int = 0) -> WeightOp:
        """A weight_edit operation, checked by type, size and value (`num_layers` 0: layer unchecked)."""
        layer, rank = d.get("layer"), d.get("rank")
        if (not isinstance(layer, int) or isinstance(layer, bool) or layer < 0
                or (num_layers and layer >= num_layers)):
            raise VindexError(f"{where}: weight_edit needs an integer layer in 0..{num_layers - 1 if num_layers else 'n'}")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_RANK:
            raise VindexError(f"{where}: weight_edit needs an integer rank between 1 and {MAX_RANK}")
        facts = d.get("facts", [])
        if not isinstance(facts, list) or not all(
                isinstance(f, dict) and all(isinstance(f.get(k, ""), str) for k in FACT_FIELDS) for f in facts):
            raise VindexError(f"{where}: facts must be a list of {{subject, relation, prompt, target}} strings")
        method = d.get("method", "rome")
        if not isinstance(method, str) or len(method) > 40:
            raise VindexError(f"{where}: method must be a short string")
        return WeightOp(layer, _unb64(d.get("u_b64"), (hidden, rank), where, "u"),
                        _unb64(d.get("v_b64"), (ffn, rank), where, "v"),
                        _unb64(d.get("keys_b64"), (ffn, rank), where, "keys"),
                        tuple({k: str(f.get(k, "")) for k in FACT_FIELDS} for f in facts), method)
