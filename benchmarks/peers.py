"""Small helpers for driving the peer engines in benchmarks (llama.cpp's live in larql/cli/benchmark.py,
which `larql bench` runs from an installed package)."""

from __future__ import annotations

from larql.cli.benchmark import llama_last_logits

__all__ = ["llama_last_logits"]
