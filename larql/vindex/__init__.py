"""The vindex: a model's weights arranged as a queryable, memory-mapped, read-only database.

    store.py         the read-only Vindex; reader.py: the protocols a store and an editable view share;
                     queries.py: describe / walk / nearest as methods
    layout.py        the format's constants; check.py, integrity.py, verify.py: what opening checks
    extract.py       model -> vindex, a layer at a time; writer.py: atomic writing; topk.py, topk_kernels.py
                     (topk_avx2.py: its AVX2 int8 kernel): each feature's top tokens; clusters.py: relation clusters
    knn.py           gate KNN, exact; knn_kernels.py: its int8 passes
    describe.py      DESCRIBE; probes.py: probe edges; tokens.py: what edges are made of; browse.py: WALK,
                     NEAREST, SELECT
    runtime.py       the model a vindex carries; weights.py: its weights
    slice.py         `larql slice`; sharing.py: `larql pull` and `larql publish`
    larql_import.py  LARQL's own vindexes (index.json version 2) converted into ours, browse level

Names resolve on first use (PEP 562): opening a store does not load extraction's numba kernels.
Extraction is `larql.vindex.extract.extract` (a package attribute of that name would be shadowed by
its submodule once imported, so the package does not export it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from larql.vindex.reader import FeatureMeta
    from larql.vindex.store import Vindex, open_vindex

_HOMES = {"FeatureMeta": "larql.vindex.reader", "Vindex": "larql.vindex.store", "open_vindex": "larql.vindex.store"}

__all__ = ["FeatureMeta", "Vindex", "open_vindex"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'larql.vindex' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
