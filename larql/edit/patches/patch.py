"""Patches: recorded edits of a vindex, saved as `.vlp` JSON and stacked on its overlay.

A patch is an ordered list of operations on (layer, feature) slots: insert (new vectors and
metadata), update (new metadata and/or vectors), delete. The overlay a vindex shows is the replay of
its applied patches in order and then of the edits not yet saved; a later operation on a slot
replaces an earlier one. Removing a patch replays the rest. The base vindex is never written.
An insert at a feature past its layer's width adds a feature (METHOD NEURON; larql's own: LARQL's
layers do not grow); applying a patch numbers its added features after those already in place.

The file keeps LARQL's `.vlp` field names (vectors are little-endian float32 in base64) and fills
the fields LARQL leaves empty: `name`, `created_at`, `base_checksum` (sha256 of the base's
index.json) and `description` (the file name, which is what LARQL's REMOVE PATCH matches) — so
REMOVE PATCH and SHOW PATCHES can name what they hold, here and in LARQL.

Both ways with LARQL: a feature operation's `down_meta` is written as LARQL's `{t, i, c}` (top
token, its id, c_score) beside our `{ids, scores}`, and an insert always carries the `entity` and
`target` strings LARQL requires. LARQL's own files are read as written: `{t, i, c}` becomes a
one-token metadata override; its KNN-store operations (`insert_knn`, `delete_knn`, a lookup after
the logits) have no larql counterpart and are refused by name.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from larql.edit.patches.overlay import MAX_ADDED, FeatureOverride, MetaOverride, PatchOverlay
from larql.edit.patches.weight_op import WeightOp, f32_b64
from larql.errors import VindexError
from larql.io.jsonfile import read_json
from larql.io.tempfiles import clean_stale, publish, temp_path
from larql.vindex.store import Vindex

PATCH_FORMAT = "larql-patch"
PATCH_VERSION = 1
OPS = ("insert", "update", "delete", "weight_edit")
FEATURE_OPS = OPS[:3]
F32 = NDArray[np.float32]
MAX_PATCH_BYTES = 1 << 30  # refused before reading; a 1,000-fact MEMIT patch of Gemma 3 270M is ~25 MB
MAX_PATCH_DEPTH = 16  # a .vlp nests 4 deep (document, operations, operation, down_meta/facts)
MAX_META_TOKENS = 1000  # a down_meta override lists at most this many tokens (extract's top-k bound)
MAX_TEXT = 10_000  # characters of an entity, relation, target, reason or description
# LARQL's KNN-store operations: a post-logits lookup keyed on a residual, which larql does not have
LARQL_KNN_OPS = {"insert_knn": "LARQL's KNN-store insert, a lookup after the logits",
                 "delete_knn": "removes LARQL KNN-store entries"}


class Shape(NamedTuple):
    """What a patch is checked against: the vindex's sizes (0: not checked)."""

    hidden: int
    ffn: int = 0
    num_layers: int = 0
    vocab: int = 0


def _index(value: Any, limit: int, what: str, where: str) -> int:
    """An integer (not a bool or float) in 0..limit-1 (any non-negative one when limit is 0)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (limit and value >= limit):
        bound = f"0..{limit - 1}" if limit else "0 or more"
        raise VindexError(f"{where}: {what} must be an integer in {bound}, got {value!r}"[:300])
    return value


def _text(d: dict[str, Any], key: str, where: str) -> str | None:
    value = d.get(key)
    if value is not None and (not isinstance(value, str) or len(value) > MAX_TEXT):
        raise VindexError(f"{where}: {key} must be a string of at most {MAX_TEXT:,} characters")
    return value


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

    def to_json(self, token_text: Callable[[int], str] | None = None) -> dict[str, Any]:
        """The operation as a .vlp entry that LARQL reads too; `token_text` names down_meta's top token
        (LARQL's `t`; empty without it)."""
        out: dict[str, Any] = {"op": self.op, "layer": self.layer, "feature": self.feature}
        for key in ("entity", "relation", "target", "reason"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
            elif self.op == "insert" and key in ("entity", "target"):
                out[key] = ""  # LARQL requires both strings in an insert; read back as absent
        for name, vec in self.vectors.items():
            out[f"{name}_vector_b64"] = f32_b64(vec)
        if self.meta is not None:
            top = self.meta.token_ids[0]
            out["down_meta"] = {"t": token_text(top) if token_text else "", "i": top, "c": self.meta.scores[0],
                                "ids": list(self.meta.token_ids), "scores": list(self.meta.scores)}
        return out

    @staticmethod
    def from_json(d: Any, where: str, shape: Shape) -> PatchOp:
        """One feature operation, checked by type and by value against the vindex's sizes."""
        if isinstance(d, dict) and d.get("op") in LARQL_KNN_OPS:
            raise VindexError(f"{where}: {d['op']} ({LARQL_KNN_OPS[d['op']]}) has no larql counterpart: "
                              f"larql edits the FFN itself; re-make the fact with INSERT INTO EDGES (a feature) "
                              f"and save that")
        if not isinstance(d, dict) or d.get("op") not in FEATURE_OPS:
            raise VindexError(f"{where}: not an operation (op must be one of {', '.join(OPS)})")
        layer = _index(d.get("layer"), shape.num_layers, "layer", where)
        feature = d.get("feature")  # from the layer's width up: a feature METHOD NEURON added (larql's)
        if (not isinstance(feature, int) or isinstance(feature, bool) or feature < 0
                or (shape.ffn and feature >= shape.ffn + MAX_ADDED)):
            bound = f"0..{shape.ffn - 1} (or {shape.ffn}.. for a feature METHOD NEURON added)" if shape.ffn else "0 or more"
            raise VindexError(f"{where}: feature must be an integer in {bound}, got {feature!r}"[:300])
        vectors = {name: _vector(d.get(f"{name}_vector_b64"), shape.hidden, where, name)
                   for name in ("gate", "up", "down") if d.get(f"{name}_vector_b64") is not None}
        if shape.ffn and feature >= shape.ffn and d["op"] == "insert" and len(vectors) < 3:
            missing = ", ".join(n for n in ("gate", "up", "down") if n not in vectors)
            raise VindexError(f"{where}: feature {feature} is past the layer's {shape.ffn} features: adding it "
                              f"needs a gate, up and down vector ({missing} missing)")
        meta = _meta(d["down_meta"], shape.vocab, where) if d.get("down_meta") is not None else None
        confidence = d.get("confidence")  # LARQL's insert confidence: its c_score is down_meta's `c`
        if confidence is not None and not _finite(confidence):
            raise VindexError(f"{where}: confidence must be a finite number, got {str(confidence)[:40]!r}")
        entity, relation, target = (_text(d, key, where) or None for key in ("entity", "relation", "target"))
        return PatchOp(d["op"], layer, feature, vectors, meta, entity, relation, target, _text(d, "reason", where))


NEURON_REASON = "neuron: "  # the reason METHOD NEURON gives its inserts (edit/methods/neuron.py)


def is_neuron(op: PatchOp) -> bool:
    """An insert made by METHOD NEURON (keyed on a subject), not by feature INSERT."""
    return op.op == "insert" and (op.reason or "").startswith(NEURON_REASON)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _vector(text: Any, hidden: int, where: str, name: str) -> F32:
    """A base64 little-endian float32 vector of `hidden` finite values."""
    if not isinstance(text, str):
        raise VindexError(f"{where}: {name}_vector_b64 must be a base64 string, not {type(text).__name__}")
    if len(text) > 4 * (4 * hidden + 2) // 3 + 4:  # longer than `hidden` floats can encode: not decoded
        raise VindexError(f"{where}: {name} vector is longer than this vindex's hidden size ({hidden}) allows "
                          f"(a patch for another model?)")
    try:
        raw = base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error) as e:
        raise VindexError(f"{where}: {name}_vector_b64 is not base64 ({e})") from None
    if len(raw) != 4 * hidden:
        raise VindexError(f"{where}: {name} vector has {len(raw) / 4:g} values; this vindex's hidden size is "
                          f"{hidden} (a patch for another model?)")
    vec = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not np.all(np.isfinite(vec)):
        raise VindexError(f"{where}: {name} vector has NaN or infinite values")
    return vec


def _larql_meta(m: dict[str, Any], vocab: int, where: str, need_c: bool) -> None:
    """LARQL's `{t, i, c}` fields of a down_meta, each checked when present (read or not: a file
    with an impossible value is refused); `c` is required when the fields are all there is."""
    if "i" in m:
        _index(m["i"], vocab or 1 << 32, "down_meta's token id i", where)
    if (need_c or "c" in m) and not _finite(m.get("c")):
        raise VindexError(f"{where}: down_meta's c (c_score) must be a finite number, got {str(m.get('c'))[:40]!r}")
    if not isinstance(m.get("t", ""), str) or len(m.get("t", "")) > MAX_TEXT:
        raise VindexError(f"{where}: down_meta's t (the top token) must be a string of at most "
                          f"{MAX_TEXT:,} characters")


def _meta(m: Any, vocab: int, where: str) -> MetaOverride:
    """down_meta: equally long lists of token ids (in the vocabulary) and finite scores, or LARQL's
    `{t, i, c}` (top token, its id, c_score) when there are no lists."""
    shape_hint = f"{where}: down_meta must be {{\"ids\": [...], \"scores\": [...]}}"
    if isinstance(m, dict) and "ids" not in m and "scores" not in m and "i" in m:
        _larql_meta(m, vocab, where, need_c=True)
        return MetaOverride((m["i"],), (float(m["c"]),))
    if not isinstance(m, dict) or not isinstance(m.get("ids"), list) or not isinstance(m.get("scores"), list):
        raise VindexError(shape_hint + " (or LARQL's {\"t\": token, \"i\": id, \"c\": score})")
    ids, scores = m["ids"], m["scores"]
    if not 1 <= len(ids) <= MAX_META_TOKENS or len(scores) != len(ids):
        raise VindexError(f"{shape_hint} with 1 to {MAX_META_TOKENS} ids and as many scores")
    for t in ids:
        _index(t, vocab or 1 << 32, "a down_meta token id", where)
    if not all(_finite(x) for x in scores):
        raise VindexError(f"{where}: down_meta scores must be finite numbers")
    _larql_meta(m, vocab, where, need_c=False)  # LARQL's fields beside the lists are not read, but must be valid
    return MetaOverride(tuple(ids), tuple(float(x) for x in scores))


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


def op_from_json(d: Any, where: str, shape: Shape) -> PatchOp | WeightOp:
    """One operation of a .vlp file: a feature edit (LARQL's) or a weight edit (larql's)."""
    if isinstance(d, dict) and d.get("op") == "weight_edit":
        return WeightOp.from_json(d, where, shape.hidden, shape.ffn, shape.num_layers)
    return PatchOp.from_json(d, where, shape)


def _model_key(name: str) -> str:
    """A model name without its owner, case and punctuation: LARQL records the Hugging Face id it
    extracted ("google/gemma-3-270m"), larql the alias or file stem ("gemma3-270m")."""
    return "".join(ch for ch in name.rsplit("/", 1)[-1].lower() if ch.isalnum())


def made_for(patch: Patch, index: dict[str, Any]) -> bool:
    """Whether the patch's `base_model` names the model of a vindex with this index.json (its
    `model`, or the stem of the file it was extracted from); a patch that names none fits any."""
    if not patch.base_model:
        return True
    source = index.get("source", {}).get("path") if isinstance(index.get("source"), dict) else None
    names = [str(index.get("model", ""))] + ([Path(source).stem] if isinstance(source, str) and source else [])
    key = _model_key(patch.base_model)
    return patch.base_model in names or (bool(key) and key in {_model_key(n) for n in names})


def index_checksum(vindex_path: Path) -> str:
    return hashlib.sha256((vindex_path / "index.json").read_bytes()).hexdigest()


def save_patch(patch: Patch, path: str | Path, overwrite: bool = False,
               token_text: Callable[[int], str] | None = None) -> Path:
    """Write a patch file atomically (temporary file + rename); an existing file is replaced only
    with `overwrite` (never one that appears while this one is written). `description` defaults to
    the file name, which LARQL's REMOVE PATCH matches; `token_text` fills down_meta's `t`."""
    path = Path(path)
    clean_stale(path)
    doc = {"format": PATCH_FORMAT, "version": PATCH_VERSION, "name": path.name, "base_model": patch.base_model,
           "base_checksum": patch.base_checksum, "created_at": patch.created_at,
           "description": patch.description or path.name, "tags": [],
           "operations": [op.to_json(token_text) if isinstance(op, PatchOp) else op.to_json() for op in patch.ops]}
    tmp = temp_path(path)
    try:
        tmp.write_text(json.dumps(doc, indent=1))
        publish(tmp, path, overwrite)
    except FileExistsError:
        raise VindexError(f"{path}: already exists; replace it with FORCE (BEGIN PATCH ... FORCE or SAVE PATCH "
                          f"FORCE), or choose another path") from None
    except OSError as e:
        raise VindexError(f"{path}: cannot write the patch ({e.strerror or e})") from e
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_patch(path: str | Path, shape: Shape) -> Patch:
    """Read a .vlp file, checked by schema and by value against `shape` (the vindex's sizes): its
    size and nesting are bounded before it is parsed, every vector is decoded and checked."""
    path = Path(path)
    doc = read_json(path, MAX_PATCH_BYTES, MAX_PATCH_DEPTH, "patch")
    if not isinstance(doc, dict) or not isinstance(doc.get("operations"), list):
        raise VindexError(f"{path}: not a patch file (no \"operations\" list)")
    if doc.get("format", PATCH_FORMAT) != PATCH_FORMAT:
        raise VindexError(f"{path}: not a patch file (format {str(doc.get('format'))[:40]!r}, not {PATCH_FORMAT!r})")
    version = doc.get("version", 1)
    if version != PATCH_VERSION:
        raise VindexError(f"{path}: patch format version {str(version)[:20]}, this larql reads {PATCH_VERSION}")
    head = {key: _text(doc, key, str(path)) for key in ("name", "base_model", "base_checksum", "created_at",
                                                           "description")}
    ops = [op_from_json(d, f"{path} operation {i}", shape) for i, d in enumerate(doc["operations"])]
    return Patch(head["name"] or path.name, path, ops, head["base_model"] or "", head["base_checksum"],
                 head["created_at"] or "", head["description"])


def renumber_added(patch: Patch, overlay: PatchOverlay) -> Patch:
    """`patch` with the features it adds (ids past a layer's width) numbered after those `overlay`
    already holds, in their order: two patches that each add from the width up would otherwise take
    the same ids and the second would overwrite the first."""
    mapping: dict[tuple[int, int], int] = {}
    following: dict[int, int] = {}
    for op in patch.ops:  # the features it adds: an insert past the width (an update there edits one in place)
        if (isinstance(op, PatchOp) and op.op == "insert" and op.feature >= overlay.widths[op.layer]
                and (op.layer, op.feature) not in mapping):
            mapping[(op.layer, op.feature)] = following.get(op.layer, overlay.next_feature(op.layer))
            following[op.layer] = mapping[(op.layer, op.feature)] + 1
    if all(feature == new for (_, feature), new in mapping.items()):
        return patch
    ops = [replace(op, feature=mapping[(op.layer, op.feature)]) if isinstance(op, PatchOp) and (op.layer, op.feature)
           in mapping else op for op in patch.ops]
    return replace(patch, ops=ops)


class PatchStack:
    """The applied patches of one opened vindex, the edits not yet saved, and the patch being
    recorded; it owns `overlay`, which is always their replay over the read-only `store`."""

    def __init__(self, store: Vindex, overlay: PatchOverlay) -> None:
        self.store, self.overlay = store, overlay
        self.applied: list[Patch] = []
        self.pending: list[PatchOp | WeightOp] = []
        self.recording: Path | None = None
        self.force = False  # BEGIN PATCH ... FORCE: SAVE PATCH may replace an existing file

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

    def begin(self, path: str | Path, force: bool = False) -> None:
        if self.recording is not None:
            raise VindexError(f"a patch is already being recorded ({self.recording.name}); SAVE PATCH first")
        self.recording, self.force = Path(path), force

    def save(self, force: bool = False) -> Patch:
        if self.recording is None:
            raise VindexError("no patch is being recorded; start one with BEGIN PATCH \"edits.vlp\" "
                              "(edits made before it are kept in the new patch)")
        v = self.store
        patch = Patch(self.recording.name, self.recording, list(self.pending), v.index["model"],
                      index_checksum(v.path), datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
        save_patch(patch, self.recording, overwrite=force or self.force, token_text=v.token_text)
        self.applied.append(patch)
        self.pending, self.recording, self.force = [], None, False
        return patch

    def apply(self, path: str | Path) -> Patch:
        v = self.store
        patch = load_patch(path, Shape(v.hidden, self.overlay.num_features, v.num_layers, v.vocab_size))
        if not made_for(patch, v.index):
            raise VindexError(f"{path}: this patch was made for {patch.base_model!r}, the vindex in use holds "
                              f"{v.index['model']!r} (if that is this model under another name, set the patch's "
                              f"base_model to {v.index['model']!r})")
        if any(p.path is not None and p.path.resolve() == Path(path).resolve() for p in self.applied):
            raise VindexError(f"{path}: this patch is already applied (REMOVE PATCH it first to re-apply)")
        patch = renumber_added(patch, self.overlay)
        self.applied.append(patch)
        try:
            self.replay()
        except VindexError as e:
            self.applied.pop()
            self.replay()
            raise VindexError(f"{path}: {e}") from None
        return patch

    def remove(self, name: str) -> Patch:
        for i, p in enumerate(self.applied):
            # by file name or path, or (as LARQL does) by description
            if name in (p.name, str(p.path), p.description) or (p.path is not None and Path(name).name == p.path.name):
                patch = self.applied.pop(i)
                try:
                    self.replay()
                except VindexError as e:  # a later edit refers to a feature the patch added
                    self.applied.insert(i, patch)
                    self.replay()
                    raise VindexError(f"cannot remove {patch.name}: a later edit refers to a feature it added "
                                      f"({e}); undo or remove that edit first") from None
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
