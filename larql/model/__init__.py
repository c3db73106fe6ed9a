"""Loading and running models: GGUF/safetensors weights, tokenizer, forward pass, generation."""

from __future__ import annotations

from larql.model.config import ModelConfig
from larql.model.generate import Generation, SamplingParams
from larql.model.load import ALIASES, load
from larql.model.model import Model

__all__ = ["ALIASES", "Generation", "Model", "ModelConfig", "SamplingParams", "load"]
