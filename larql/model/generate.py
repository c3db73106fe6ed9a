"""Token loop and sampling on top of the forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; top_k 0 and top_p 1.0 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class Generation:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # the new tokens
    text: str = ""  # the new tokens, decoded
    finish_reason: str = "length"  # "length" | "stop"


def log_softmax(logits: NDArray[np.floating[Any]], dtype: type[np.floating[Any]] = np.float32) -> NDArray[Any]:
    """log softmax of `(vocab,)` logits, computed in float64 and shifted by the max (no overflow);
    returned as `dtype`: float32 for sampling and tables, float64 where NLLs are compared (edit/measure/evaluate.py)."""
    shifted = logits.astype(np.float64) - np.max(logits)
    return (shifted - np.log(np.sum(np.exp(shifted)))).astype(dtype)


def sample(logits: NDArray[np.float32], params: SamplingParams, rng: np.random.Generator) -> int:
    """Pick the next token id from `(vocab,)` logits."""
    if params.temperature <= 0.0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    if params.top_k > 0 and params.top_k < len(scaled):
        candidates = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
    else:
        candidates = np.arange(len(scaled))
    candidates = candidates[np.argsort(-scaled[candidates], kind="stable")]  # most likely first
    probs = np.exp(scaled[candidates] - scaled[candidates[0]])
    probs /= probs.sum()
    if params.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)  # smallest set reaching top_p
        candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
    return int(rng.choice(candidates, p=probs))
