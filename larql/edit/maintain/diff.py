"""DIFF: what differs between two vindexes of one model, feature by feature, and the patch that
turns the first into the second.

Each side is read as it runs, overlay included (`CURRENT` may carry unsaved edits): with model
weights, the float32 FFN matrices COMPILE would write (edited rows and columns in, ROME / MEMIT
deltas added); at the browse level, the gate vectors. A feature differs when its gate row, up row,
down column or down_meta differ. A weight edit changes every column of W_down, so it shows as every
feature of its layer. Tensors outside the FFN (attention, norms, embeddings) cannot be carried by a
patch: they are reported as `dense`, and INTO PATCH refuses them.

The patch, applied to the first vindex, gives the second's logits: a changed feature becomes an
insert of the second's gate, up and down vectors and its down_meta (all three vectors, so the
result does not depend on what the first's overlay held), a feature the second silenced a delete,
a metadata-only change an update.

A layer whose only change is to W_down, by a delta of small rank r (a ROME edit is rank 1, a MEMIT
batch rank n), becomes one weight_edit of factors U (hidden x r), V (ffn x r) instead of an insert
per feature: r(hidden + 2 ffn) floats, not ffn x 3 hidden. The rank is what the delta's singular
values show above float32 rounding, and the factors are kept only if U Vᵀ reproduces every entry of
the delta to within a few ulps of the weights (else the layer stays per feature).

The two may differ in FFN width: features METHOD NEURON added (in an overlay, or compiled into a
vindex, which COMPILE writes wider: edit/bake/widen.py). Each layer is compared at the wider of the two,
the narrower side padded with zero features (what COMPILE pads with), so a feature only one side
has is an insert (past the first's width: an added feature) or a delete.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from larql.edit.bake.compile import edited_layers, edited_matrix
from larql.edit.bake.widen import gate_rows, widened, zero_rows
from larql.edit.patches.overlay import MetaOverride
from larql.edit.patches.patch import Patch, PatchOp, index_checksum, save_patch
from larql.edit.patches.weight_op import WeightOp
from larql.edit.state.view import EditableVindex
from larql.errors import VindexError
from larql.vindex import layout
from larql.vindex.weights import VindexWeightSource

_FFN = ("ffn_gate", "ffn_up", "ffn_down")
# the largest rank DIFF stores as factors (a 40-fact MEMIT batch is rank 40); past it, and whenever
# factors would not be smaller than the changed down columns, the layer is written per feature
MAX_FACTOR_RANK = 64
# float32's machine epsilon: the rounding a weight carries, which a delta's tail is allowed
_EPS32 = float(np.finfo(np.float32).eps)


@dataclass(frozen=True)
class FeatureDiff:
    layer: int
    feature: int  # -1 for a dense tensor
    status: str  # modified | added | deleted | metadata | dense | low_rank
    changed: tuple[str, ...]  # gate, up, down, meta; or the tensor name
    a_token: int
    b_token: int


@dataclass
class DiffReport:
    rows: list[FeatureDiff] = field(default_factory=list)
    ops: list[PatchOp | WeightOp] = field(default_factory=list)

    @property
    def dense(self) -> list[str]:
        return [r.changed[0] for r in self.rows if r.status == "dense"]


def _check_same_model(a: EditableVindex, b: EditableVindex) -> None:
    # not intermediate_size: added features (METHOD NEURON) compile into a wider FFN of the same model
    keys = ("family", "num_layers", "hidden_size", "vocab_size")
    ia, ib = a.index, b.index
    differ = [k for k in keys if ia[k] != ib[k]]
    if differ:
        k = differ[0]
        raise VindexError(f"DIFF needs two vindexes of one model: {a.path} has {k} {ia[k]}, {b.path} has {ib[k]}")


class _Side:
    """One vindex as it runs: per layer, its FFN matrices (or gate vectors) and down_meta."""

    def __init__(self, v: EditableVindex, weights: bool) -> None:
        self.v, self.weights = v, weights
        self.edited = edited_layers(v)
        self.source = VindexWeightSource(v.path) if weights else None

    def matrix(self, layer: int, kind: str, width: int) -> np.ndarray:
        """(width, hidden) for all three: added features at their ids, zero features past them."""
        name = f"blk.{layer}.{kind}.weight"
        m = widened(self.source, name, edited_matrix(self.source, name, self.edited), self.v.overlay, width)
        if m is None:
            m = self.source.matrix(name)  # type: ignore[union-attr]
        m = np.asarray(m if isinstance(m, np.ndarray) else m.dequantize())
        return m.T if kind == "ffn_down" else m

    def gates(self, layer: int, width: int) -> np.ndarray:
        gate = np.array(self.v.gate_vectors(layer), dtype=np.float32)
        vectors, gone, _ = self.edited.get(layer, ({}, set(), None))
        for f, ov in vectors.items():
            if ov.gate is not None:
                gate[f] = ov.gate
        for f in gone:
            gate[f] = 0.0
        return gate_rows(gate, self.v.overlay, layer, width)


def _row_differs(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.asarray(np.any(x != y, axis=1))


def diff(a: EditableVindex, b: EditableVindex, layer: int | None = None) -> DiffReport:
    """Every feature (and dense tensor) in which `b` differs from `a`, with the patch ops a -> b."""
    _check_same_model(a, b)
    weights = a.has_model_weights and b.has_model_weights
    sa, sb = _Side(a, weights), _Side(b, weights)
    report = DiffReport()
    layers = range(a.num_layers) if layer is None else [layer]
    for L in layers:
        width = max(a.num_features(L), b.num_features(L))  # either may have added features
        ids_a, sc_a = (zero_rows(x, width) for x in a.down_meta(L))
        ids_b, sc_b = (zero_rows(x, width) for x in b.down_meta(L))
        meta = _row_differs(ids_a, ids_b) | _row_differs(sc_a, sc_b)
        if weights:
            mats = {k: (sa.matrix(L, k, width), sb.matrix(L, k, width)) for k in _FFN}
        else:
            mats = {"ffn_gate": (sa.gates(L, width), sb.gates(L, width))}
        parts = {k[4:]: _row_differs(x, y) for k, (x, y) in mats.items()}
        changed = meta.copy()
        for d in parts.values():
            changed |= d
        factors = None
        # a weight edit's V spans the first's base features: wider than those, the layer goes per feature
        if (weights and width == a.overlay.widths[L] and not parts["gate"].any() and not parts["up"].any()
                and parts["down"].sum() > 1):
            factors = low_rank(*mats["ffn_down"])
        if factors is not None:  # W_down moved by U Vᵀ: one weight edit; metadata changes stay updates
            u, v = factors
            report.rows.append(FeatureDiff(L, -1, "low_rank", (f"ffn_down, rank {u.shape[1]}",), 0, 0))
            report.ops.append(WeightOp(L, u, v, v, (), "diff"))
            changed = meta
        for f in np.flatnonzero(changed):
            row = _feature(L, int(f), parts, meta, mats, (ids_a, ids_b))
            report.rows.append(row)
            report.ops.append(_op(row, mats, ids_b[f], sc_b[f]))
    if weights:  # even with a layer filter: a patch from a partial look must not hide them
        report.rows += _dense(a, b)
    return report


def low_rank(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Factors (u (hidden, r), v (ffn, r)) with a.T + u v.T == b.T to float32 rounding, for `a`, `b`
    W_down as (ffn, hidden), or None when the delta is not of small rank.

    The keys a weight edit carries (what later edits at the layer hold still) are not in the
    weights; DIFF stores v, the directions of the FFN's activations the delta reads."""
    d = b.astype(np.float64) - a.astype(np.float64)  # (ffn, hidden), exact: both are float32
    scale = max(float(np.max(np.abs(a))), float(np.max(np.abs(b))), 1e-30)
    tol = 4 * _EPS32 * scale  # a few ulps of the largest weight, per entry
    q, s, pt = np.linalg.svd(d, full_matrices=False)  # d = q diag(s) pt
    noise = tol * np.sqrt(max(d.shape))  # the largest singular value rounding alone can make
    r = int(np.sum(s > noise))
    n_changed = int(np.sum(np.any(d != 0, axis=1)))
    if not 1 <= r <= MAX_FACTOR_RANK or r * (d.shape[1] + 2 * d.shape[0]) >= n_changed * 3 * d.shape[1]:
        return None
    v = q[:, :r] * s[:r]  # (ffn, r)
    u = pt[:r].T  # (hidden, r)
    if np.max(np.abs(v @ u.T - d)) > tol:
        return None
    # v's columns orthonormal (the keys), the scale in u: u v.T is the same product
    return np.ascontiguousarray(u * s[:r], dtype=np.float32), np.ascontiguousarray(q[:, :r], dtype=np.float32)


def _feature(L: int, f: int, parts: dict[str, np.ndarray], meta: np.ndarray, mats: dict[str, tuple[np.ndarray, np.ndarray]],
             ids: tuple[np.ndarray, np.ndarray]) -> FeatureDiff:
    which = tuple(k for k, d in parts.items() if d[f]) + (("meta",) if meta[f] else ())
    out_a, out_b = mats.get("ffn_down", mats["ffn_gate"])
    silent_a, silent_b = not np.any(out_a[f]), not np.any(out_b[f])
    status = ("deleted" if silent_b and not silent_a else "added" if silent_a and not silent_b
              else "metadata" if which == ("meta",) else "modified")
    return FeatureDiff(L, f, status, which, int(ids[0][f, 0]), int(ids[1][f, 0]))


def _op(row: FeatureDiff, mats: dict[str, tuple[np.ndarray, np.ndarray]], ids: np.ndarray,
        scores: np.ndarray) -> PatchOp:
    L, f = row.layer, row.feature
    meta = MetaOverride(tuple(int(i) for i in ids), tuple(float(s) for s in scores))
    if row.status == "deleted":  # silenced in b: the overlay's delete also hides it from KNN, as b does
        return PatchOp("delete", L, f, reason="DIFF")
    if row.status == "metadata":
        return PatchOp("update", L, f, meta=meta, reason="DIFF")
    vectors = {k[4:]: np.ascontiguousarray(y[f], dtype=np.float32) for k, (_, y) in mats.items()}
    return PatchOp("insert", L, f, vectors, meta, reason="DIFF")


def _dense(a: EditableVindex, b: EditableVindex) -> list[FeatureDiff]:
    """Non-FFN tensors whose values differ (a patch cannot carry these)."""
    src_a, src_b = VindexWeightSource(a.path), VindexWeightSource(b.path)
    names = [e["name"] for e in json.loads((a.path / layout.MANIFEST_FILE).read_text())]
    out = []
    for name in names:
        if any(f".{k}." in name for k in _FFN):
            continue
        if not src_b.has(name):
            out.append(FeatureDiff(-1, -1, "dense", (name,), 0, 0))
            continue
        ma, mb = src_a.matrix(name), src_b.matrix(name)
        same = (ma.qtype == mb.qtype and np.array_equal(ma.raw, mb.raw)) or \
            (ma.shape == mb.shape and np.array_equal(ma.dequantize(), mb.dequantize()))
        if not same:
            layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
            out.append(FeatureDiff(layer, -1, "dense", (name,), 0, 0))
    return out


def write_diff_patch(a: EditableVindex, report: DiffReport, path: str | Path, overwrite: bool = False) -> Path:
    """The patch a -> b (refused when b differs outside the FFN)."""
    if report.dense:
        shown = ", ".join(report.dense[:3]) + (f" and {len(report.dense) - 3} more" if len(report.dense) > 3 else "")
        raise VindexError(f"the second vindex differs in {shown}, outside the FFN, which a patch cannot carry "
                          f"(a different model, or a dense fine-tune?); COMPILE or convert it instead")
    patch = Patch(Path(path).name, Path(path), list(report.ops), a.index["model"], index_checksum(a.path),
                  datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))  # description: the file name
    return save_patch(patch, path, overwrite, token_text=a.token_text)
