"""larql: a language model as a database.

The facade (whether a path is a vindex, a GGUF file or an HF directory is decided in
edit/state/load_any.py, which LQL's USE MODEL shares):

    larql.load(src)          a Model: alias / .gguf / HF directory, or a vindex (its walk FFN over an
                             editable view, so patches applied to the view show in the model)
    larql.open_vindex(path)  the read-only store (vindex.store.Vindex)
    larql.edit_vindex(path)  the editable view (edit.view.EditableVindex: store + overlay + patches)
    larql.plot               pictures of results (larql/shell/plot.py; the extra `larql[plot]`)

Everything resolves on first use (PEP 562): `import larql` loads no numpy, numba or faiss, and LQL
parsing and planning never load the numba runtime.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from larql.version import __version__

if TYPE_CHECKING:
    from larql.edit.state.view import EditableVindex
    from larql.model.model import Model
    from larql.vindex.store import Vindex

__all__ = ["EditableVindex", "Model", "Vindex", "__version__", "edit_vindex", "load", "open_vindex"]

_CLASSES = {"Model": "larql.model.model", "Vindex": "larql.vindex.store", "EditableVindex": "larql.edit.state.view"}
# modules the facade names: `from larql import plot` (the module lives with the presentation code)
_MODULES = {"plot": "larql.shell.plot"}


def load(src: str | Path) -> Model:
    """Load a model: a bundled alias (`gemma3-270m`, `smollm2-135m`), a GGUF file, an HF directory,
    or an inference-level vindex directory (the model it carries, its FFN the walk FFN over an
    editable view of the vindex; `.dense()` is the same model without it).

    Weights stay memory-mapped in their stored quantization; nothing is dequantized up front.

    Example:
        >>> m = larql.load("gemma3-270m")
        >>> m.generate("The capital of France is", max_new_tokens=4).text
    """
    from larql.edit.state.load_any import load_any

    return load_any(src)


def open_vindex(path: str | Path) -> Vindex:
    """Open a vindex read-only, verified first (index.json: schema, consistency, seal; every file: sha256).

    Example:
        >>> v = larql.open_vindex("g.vindex")
        >>> v.gate_knn(10, v.entity_embedding("France"), k=5)
    """
    from larql.vindex.store import open_vindex as open_store

    return open_store(path)


def edit_vindex(path: str | Path) -> EditableVindex:
    """Open a vindex for editing: the read-only store wrapped in an EditableVindex, whose overlay
    (empty at first) INSERT / DELETE / UPDATE / APPLY PATCH fill; the files are never written.

    Example:
        >>> v = larql.edit_vindex("g.vindex")
        >>> v.patches.apply("fiction.vlp"); v.model().generate("The capital of Atlantis is", 3).text
    """
    from larql.edit.state.view import edit_vindex as open_view

    return open_view(path)


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    home = _CLASSES.get(name)
    if home is None:
        raise AttributeError(f"module 'larql' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
