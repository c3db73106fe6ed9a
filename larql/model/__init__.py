"""Loading and running models: GGUF/safetensors weights, tokenizer, forward pass, generation.

Names resolve on first use (PEP 562), so importing a submodule such as `larql.model.tokenizer`
does not load the numba runtime. Loading is `larql.load` (or `larql.model.load.load` for GGUF / HF
only): a package attribute `load` would be shadowed by its submodule of that name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from larql.model.config import ModelConfig
    from larql.model.generate import Generation, SamplingParams
    from larql.model.load import ALIASES
    from larql.model.model import Model

_HOMES = {"ModelConfig": "larql.model.config", "Generation": "larql.model.generate",
          "SamplingParams": "larql.model.generate", "ALIASES": "larql.model.load", "Model": "larql.model.model"}

__all__ = ["ALIASES", "Generation", "Model", "ModelConfig", "SamplingParams"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'larql.model' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
