"""Small helpers for driving the peer engines in benchmarks (llama.cpp's live in larql/bench.py,
which `larql bench` runs from an installed package)."""

from __future__ import annotations

from larql.bench import llama_last_logits

__all__ = ["llama_last_logits"]
