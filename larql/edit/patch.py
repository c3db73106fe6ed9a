"""Patches: recorded edits of a vindex, saved as `.vlp` JSON and stacked on its overlay.

A patch is an ordered list of operations on (layer, feature) slots: insert (new vectors and
metadata), update (new metadata and/or vectors), delete. The overlay a vindex shows is the replay of
its applied patches in order and then of the edits not yet saved; a later operation on a slot
replaces an earlier one. Removing a patch replays the rest. The base vindex is never written.

The file keeps LARQL's `.vlp` field names (vectors are little-endian float32 in base64) and fills
the fields LARQL leaves empty: `name`, `created_at`, `base_checksum` (sha256 of the base's
index.json) — so REMOVE PATCH and SHOW PATCHES can name what they hold.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.edit.overlay import FeatureOverride, MetaOverride, PatchOverlay
from larql.edit.weight_op import WeightOp
from larql.errors import VindexError
from larql.vindex.store import Vindex

PATCH_FORMAT = "larql-patch"
PATCH_VERSION = 1
OPS = ("insert", "update", "delete", "weight_edit")
FEATURE_OPS = OPS[:3]
F32 = NDArray[np.float32]


@dataclass(frozen=True)
class PatchOp:
    """One edit. `vectors` holds any of gate / up / down; `meta` what the feature writes."""

    op: str  # insert | update | delete
    layer: int
    feature: int
    vectors: dict[str, F32] = field(default_factory=dict)
    meta: MetaOverride | None = None
    entity: str | None = None
    relation: str | None = None
    target: str | None = None
    reason: str | None = None

    def apply(self, overlay: PatchOverlay) -> None:
        if self.op == "delete":
            overlay.delete(self.layer, self.feature)
            return
        if self.op == "insert":
            overlay.remove(self.layer, self.feature)  # an insert owns the slot
        if self.vectors:
            old = overlay[(self.layer, self.feature)] if (self.layer, self.feature) in overlay else FeatureOverride()
            merged = {k: getattr(old, k) for k in ("gate", "up", "down")} | self.vectors
            overlay.set(self.layer, self.feature, FeatureOverride(**merged))
        if self.meta is not None:
            overlay.set_meta(self.layer, self.feature, self.meta)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "layer": self.layer, "feature": self.feature}
        for key in ("entity", "relation", "target", "reason"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        for name, vec in self.vectors.items():
            out[f"{name}_vector_b64"] = base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()
        if self.meta is not None:
            out["down_meta"] = {"ids": list(self.meta.token_ids), "scores": list(self.meta.scores)}
        return out

    @staticmethod
    def from_json(d: Any, where: str, hidden: int) -> PatchOp:
        if not isinstance(d, dict) or d.get("op") not in FEATURE_OPS:
            raise VindexError(f"{where}: not an operation (op must be one of {', '.join(OPS)})")
        try:
            layer, feature = int(d["layer"]), int(d["feature"])
        except (KeyError, TypeError, ValueError):
            raise VindexError(f"{where}: {d.get('op')} needs integer layer and feature") from None
        vectors = {}
        for name in ("gate", "up", "down"):
            text = d.get(f"{name}_vector_b64")
            if text is None:
                continue
            try:
                vec = np.frombuffer(base64.b64decode(text, validate=True), dtype="<f4").astype(np.float32)
            except ValueError as e:
                raise VindexError(f"{where}: {name}_vector_b64 is not base64 ({e})") from None
            if vec.shape != (hidden,):
                raise VindexError(f"{where}: {name} vector has {vec.size} values; this vindex's hidden size is "
                                  f"{hidden} (a patch for another model?)")
            vectors[name] = vec
        meta = None
        if d.get("down_meta") is not None:
            m = d["down_meta"]
            try:
                meta = MetaOverride(tuple(int(t) for t in m["ids"]), tuple(float(s) for s in m["scores"]))
            except (KeyError, TypeError, ValueError):
                raise VindexError(f"{where}: down_meta must be {{\"ids\": [...], \"scores\": [...]}}") from None
        return PatchOp(d["op"], layer, feature, vectors, meta, d.get("entity"), d.get("relation"),
                       d.get("target"), d.get("reason"))


@dataclass
class Patch:
    name: str  # the file name it was saved as / loaded from
    path: Path | None
    ops: list[PatchOp | WeightOp]
    base_model: str = ""
    base_checksum: str | None = None
    created_at: str = ""
    description: str | None = None

    def counts(self) -> dict[str, int]:
        return {op: sum(1 for o in self.ops if o.op == op) for op in OPS}

    def summary(self) -> str:
        c = self.counts()
        text = f"{len(self.ops)} operations: {c['insert']} inserts, {c['update']} updates, {c['delete']} deletes"
        return text + (f", {c['weight_edit']} weight edits" if c["weight_edit"] else "")

    def facts(self) -> list[str]:
        """What the patch teaches: each weight edit's facts and each feature insert's triple."""
        out = []
        for op in self.ops:
            if isinstance(op, WeightOp):
                out += op.labels()
            elif op.op == "insert" and op.entity is not None:
                out.append(f"{op.entity} -[{op.relation or '?'}]-> {op.target}")
        return out


def op_from_json(d: Any, where: str, hidden: int, ffn: int) -> PatchOp | WeightOp:
    """One operation of a .vlp file: a feature edit (LARQL's) or a weight edit (larql's)."""
    if isinstance(d, dict) and d.get("op") == "weight_edit":
        return WeightOp.from_json(d, where, hidden, ffn)
    return PatchOp.from_json(d, where, hidden)


def index_checksum(vindex_path: Path) -> str:
    return hashlib.sha256((vindex_path / "index.json").read_bytes()).hexdigest()


def save_patch(patch: Patch, path: str | Path) -> Path:
    """Write a patch file atomically (temporary file + rename)."""
    path = Path(path)
    doc = {"format": PATCH_FORMAT, "version": PATCH_VERSION, "name": path.name, "base_model": patch.base_model,
           "base_checksum": patch.base_checksum, "created_at": patch.created_at, "description": patch.description,
           "tags": [], "operations": [op.to_json() for op in patch.ops]}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise VindexError(f"{path}: cannot write the patch ({e.strerror or e})") from e
    return path


def load_patch(path: str | Path, hidden: int, ffn: int = 0) -> Patch:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise VindexError(f"{path}: no such patch file") from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise VindexError(f"{path}: not a patch file (not valid JSON: {e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("operations"), list):
        raise VindexError(f"{path}: not a patch file (no \"operations\" list)")
    version = doc.get("version", 1)
    if version != PATCH_VERSION:
        raise VindexError(f"{path}: patch format version {version}, this larql reads {PATCH_VERSION}")
    ops = [op_from_json(d, f"{path} operation {i}", hidden, ffn) for i, d in enumerate(doc["operations"])]
    return Patch(str(doc.get("name") or path.name), path, ops, str(doc.get("base_model") or ""),
                 doc.get("base_checksum"), str(doc.get("created_at") or ""), doc.get("description"))


class PatchStack:
    """The applied patches of one opened vindex, the edits not yet saved, and the patch being
    recorded; it owns `overlay`, which is always their replay over the read-only `store`."""

    def __init__(self, store: Vindex, overlay: PatchOverlay) -> None:
        self.store, self.overlay = store, overlay
        self.applied: list[Patch] = []
        self.pending: list[PatchOp | WeightOp] = []
        self.recording: Path | None = None

    def record(self, op: PatchOp | WeightOp) -> None:
        op.apply(self.overlay)  # validates before the op is kept
        self.pending.append(op)

    def record_all(self, ops: list[PatchOp | WeightOp]) -> None:
        """Record every op or none: on a failure the overlay is exactly as before."""
        kept = len(self.pending)
        try:
            for op in ops:
                self.record(op)
        except Exception:
            del self.pending[kept:]
            self.replay()
            raise

    def undo(self, count: int) -> None:
        """Forget the last `count` unsaved edits (the overlay replays the rest, bit for bit)."""
        if count:
            del self.pending[-count:]
            self.replay()

    def begin(self, path: str | Path) -> None:
        if self.recording is not None:
            raise VindexError(f"a patch is already being recorded ({self.recording.name}); SAVE PATCH first")
        self.recording = Path(path)

    def save(self) -> Patch:
        if self.recording is None:
            raise VindexError("no patch is being recorded; start one with BEGIN PATCH \"edits.vlp\" "
                              "(edits made before it are kept in the new patch)")
        v = self.store
        patch = Patch(self.recording.name, self.recording, list(self.pending), v.index["model"],
                      index_checksum(v.path), datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
        save_patch(patch, self.recording)
        self.applied.append(patch)
        self.pending, self.recording = [], None
        return patch

    def apply(self, path: str | Path) -> Patch:
        v = self.store
        patch = load_patch(path, v.hidden, int(v.index["intermediate_size"]))
        if patch.base_model and patch.base_model != v.index["model"]:
            raise VindexError(f"{path}: this patch was made for {patch.base_model!r}, the vindex in use holds "
                              f"{v.index['model']!r}")
        if any(p.path is not None and p.path.resolve() == Path(path).resolve() for p in self.applied):
            raise VindexError(f"{path}: this patch is already applied (REMOVE PATCH it first to re-apply)")
        self.applied.append(patch)
        try:
            self.replay()
        except VindexError:
            self.applied.pop()
            self.replay()
            raise
        return patch

    def remove(self, name: str) -> Patch:
        for i, p in enumerate(self.applied):
            if name in (p.name, str(p.path)) or (p.path is not None and Path(name).name == p.path.name):
                patch = self.applied.pop(i)
                self.replay()
                return patch
        known = ", ".join(p.name for p in self.applied) or "none"
        raise VindexError(f"no applied patch named {name!r} (applied: {known})")

    def replay(self) -> None:
        self.overlay.clear()
        for patch in self.applied:
            for op in patch.ops:
                op.apply(self.overlay)
        for op in self.pending:
            op.apply(self.overlay)
