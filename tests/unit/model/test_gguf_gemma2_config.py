"""Gemma 2 from GGUF metadata follows llama.cpp's rules for what the file does not store: the query
scale from the model size (1/sqrt(hidden // heads) for the 27B's 46 layers, else 1/sqrt(head_dim)),
every 2nd layer global, a 4096 window and soft-caps 50 / 30 when their keys are absent."""

from __future__ import annotations

from typing import Any

import pytest

from larql.model.config import config_from_gguf


def _meta(layers: int, hidden: int, heads: int, head_dim: int, **extra: Any) -> dict[str, Any]:
    return {"general.architecture": "gemma2", "gemma2.block_count": layers, "gemma2.embedding_length": hidden,
            "gemma2.feed_forward_length": 4 * hidden, "gemma2.attention.head_count": heads,
            "gemma2.attention.head_count_kv": heads // 2, "gemma2.attention.key_length": head_dim,
            "gemma2.attention.layer_norm_rms_epsilon": 1e-6, **extra}


@pytest.mark.parametrize(("layers", "hidden", "heads", "head_dim", "scale_dim"), [
    (26, 2304, 8, 256, 256),  # Gemma 2 2B: query_pre_attn_scalar 256
    (42, 3584, 16, 256, 256),  # 9B: 256
    (46, 4608, 32, 128, 144),  # 27B: query_pre_attn_scalar 144 = 4608 / 32, not head_dim 128
])
def test_query_scale_by_model_size(layers: int, hidden: int, heads: int, head_dim: int, scale_dim: int) -> None:
    cfg = config_from_gguf(_meta(layers, hidden, heads, head_dim), "g.gguf", True)
    assert cfg.attn_scale == scale_dim ** -0.5


def test_defaults_are_llama_cpps() -> None:
    cfg = config_from_gguf(_meta(5, 64, 4, 16), "g.gguf", True)
    assert cfg.global_layers == (False, True, False, True, False)  # set_swa_pattern(2): odd layers global
    assert (cfg.sliding_window, cfg.attn_softcap, cfg.final_softcap) == (4096, 50.0, 30.0)
    assert cfg.embed_scale == 8.0 and cfg.sandwich_norms and cfg.activation == "gelu_tanh"
    given = config_from_gguf(_meta(5, 64, 4, 16, **{"gemma2.attention.sliding_window": 8,
                                                    "gemma2.attn_logit_softcapping": 5.0,
                                                    "gemma2.final_logit_softcapping": 10.0}), "g.gguf", True)
    assert (given.sliding_window, given.attn_softcap, given.final_softcap) == (8, 5.0, 10.0)
