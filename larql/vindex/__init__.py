"""The vindex: a model's weights arranged as a queryable, memory-mapped database."""

from __future__ import annotations

from larql.vindex.extract import extract
from larql.vindex.store import FeatureMeta, Vindex, open_vindex

__all__ = ["FeatureMeta", "Vindex", "extract", "open_vindex"]
