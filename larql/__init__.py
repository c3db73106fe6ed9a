"""larql: a language model as a database."""

from __future__ import annotations

from larql.model.load import load
from larql.model.model import Model

__version__ = "0.1.0"

__all__ = ["Model", "__version__", "load"]
