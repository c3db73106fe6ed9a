"""Loading and running models: GGUF/safetensors weights, tokenizer, forward pass, generation.

    model.py            Model: config + weights + tokenizer; tokenize, forward, generate, run_with_cache, crown
    load.py             an alias, a GGUF file, an HF directory or a Hub id -> Model; hub.py: Hub ids
    config.py           ModelConfig from GGUF metadata; hf_config.py and hf_names.py: from an HF directory
    gguf_file.py        the GGUF reader; gguf_fused.py: fused tensors read apart; gguf_fuse.py, gguf_meta.py:
                        fused tensors and metadata written back for COMPILE
    weights.py          named weight handles per layer; tokenizer.py, chat_template.py: text in and out
    forward.py          the forward pass; attention.py, ffn.py: its two blocks; fused.py, prefill_ops.py,
                        decode_layer.py: numba steps of prefill and decode; segments.py: packed batches
    prefix.py           reusing a shared prefix's KV cache; busy.py: decode on a busy machine; prewarm.py
    generate.py         the token loop and sampling
    hooks.py            hook points, interventions, the activation cache; interp.py: interpretability
                        primitives on them; targets.py: target and subject tokens; crown.py: crown discovery;
                        trace_file.py: saved traces; sae.py: sparse autoencoders (SAELens' format) at a hook point;
                        transcoder.py: transcoders in place of an MLP; sae_load.py: both read from their
                        files; sae_labels.py: their features' labels (Neuronpedia's explanations)
    grad.py             gradients through the model's top for edits; packed_attention.py, activation_grad.py
    remote_ffn.py       an FFN computed elsewhere (layer or expert shards over HTTP)
    export_hf.py        a model written as an HF directory

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
