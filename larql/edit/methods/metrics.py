"""The key metric of each layer a weight or neuron edit solves at: (C + ridge)^-1 of the layer's
second moments, from memory, the statistics cache beside the vindex, or computed once."""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from pathlib import Path

from larql.edit.methods.neuron import bias_direction
from larql.edit.methods.rome import KeyMetric
from larql.edit.methods.stats import second_moments, token_budget
from larql.edit.state.edited import EditTarget
from larql.model.model import Model
from larql.model.tokenizer import cache_dir


def stats_dir(v: EditTarget) -> Path:
    """Beside the vindex (`g.vindex.stats/`) when that directory is writable, else the cache."""
    beside = v.path.parent / f"{v.path.name}.stats"
    if beside.is_dir() or (v.path.parent.exists() and _writable(v.path.parent)):
        return beside
    return cache_dir() / "stats" / v.path.name


def _writable(p: Path) -> bool:
    return os.access(p, os.W_OK)


# id(weights) -> {(layer, tokens, point): KeyMetric}. The statistics are the weights' (their cache file is
# named by them), so every model over the same weights shares them: a server's sessions, `with_edits`,
# `dense()`. An entry goes when its weights do (Weights, holding arrays, cannot be a dictionary key).
_metrics: dict[int, dict[tuple[int, int, str], KeyMetric]] = {}


def _metrics_of(model: Model) -> dict[tuple[int, int, str], KeyMetric]:
    key = id(model.weights)
    if key not in _metrics:
        weakref.finalize(model.weights, _metrics.pop, key, None)
    return _metrics.setdefault(key, {})


def key_metrics(model: Model, layers: Sequence[int], directory: Path | None,
                n_tokens: int | None = None, point: str = "key") -> dict[int, KeyMetric]:
    """C (+ ridge), factored, per layer: from memory, the statistics cache, or computed; of the
    down projection's input (`point="key"`) or of the MLP's normalised input ("input"). Computed on
    the dense model, so that they are the same whichever model over these weights asks first."""
    n_tokens = n_tokens or token_budget(model.config.ffn)
    have = _metrics_of(model)
    missing = [layer for layer in layers if (layer, n_tokens, point) not in have]
    if missing:
        for layer, got in second_moments(model.dense(), missing, directory, n_tokens, point).items():
            bias = bias_direction(got.cov, got.mean) if point == "input" else None
            have[(layer, n_tokens, point)] = KeyMetric(got.cov, bias=bias)
    return {layer: have[(layer, n_tokens, point)] for layer in layers}
