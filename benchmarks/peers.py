"""Small helpers for driving the peer engines in benchmarks."""

from __future__ import annotations

from typing import Any

import numpy as np


def llama_last_logits(llm: Any) -> np.ndarray:
    """llama-cpp-python's logits for the last evaluated token. `Llama.scores` stays zero unless
    logits_all=True (sampling moved into its sampler), and logits_all would make llama.cpp compute
    the lm_head for every prompt position, so the context is read directly."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float32)
