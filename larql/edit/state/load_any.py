"""Which kind of source a path is, and the model it gives: a bundled alias, a GGUF file or an HF
directory (model/load.py), or a vindex directory, whose model runs the walk FFN over an editable
view (so patches applied to the view show in the model). Both the facade's `larql.load` and LQL's
USE MODEL open a model through here; it sits in edit/ because a vindex's model needs the view."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from larql.model.load import load_path, resolve

if TYPE_CHECKING:
    from larql.model.model import Model


def is_vindex(path: Path) -> bool:
    """A directory holding index.json: a vindex, not a model."""
    return path.is_dir() and (path / "index.json").is_file()


def load_any(src: str | Path) -> Model:
    """The model `src` names: an alias, a .gguf, an HF directory, or an inference-level vindex.

    Example:
        >>> load_any("gemma3-270m").generate("The capital of France is", max_new_tokens=4).text
    """
    name, path = resolve(src)
    if is_vindex(path):
        from larql.edit.state.view import edit_vindex  # the store and faiss load only for a vindex

        return edit_vindex(path).model()
    return load_path(name, path)
