"""SAEs the tests write in SAELens' on-disk format (cfg.json + sae_weights.safetensors): random but
correctly shaped ones for plumbing, and ones whose features are known directions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

F32 = np.float32


def write_sae(path: Path, tensors: dict[str, np.ndarray], cfg: dict[str, Any]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path / "sae_weights.safetensors"))
    (path / "cfg.json").write_text(json.dumps(cfg))
    return path


def random_tensors(d_in: int, d_sae: int, seed: int, arch: str = "standard") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = {"W_enc": (rng.standard_normal((d_in, d_sae)) / np.sqrt(d_in)).astype(F32),
         "W_dec": (rng.standard_normal((d_sae, d_in)) / np.sqrt(d_sae)).astype(F32),
         "b_enc": (0.1 * rng.standard_normal(d_sae)).astype(F32),
         "b_dec": (0.1 * rng.standard_normal(d_in)).astype(F32)}
    if arch == "jumprelu":  # mostly positive thresholds, a few negative (SAELens uses relu(threshold))
        t["threshold"] = (0.3 + 0.3 * rng.standard_normal(d_sae)).astype(F32)
    return t


def v6_cfg(d_in: int, d_sae: int, arch: str = "standard", hook: str = "blocks.0.hook_resid_post",
           **extra: Any) -> dict[str, Any]:
    """A config as SAELens 6 saves it: hook_name under metadata."""
    return {"d_in": d_in, "d_sae": d_sae, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
            "normalize_activations": "none", "reshape_activations": "none", "architecture": arch,
            "metadata": {"hook_name": hook, "model_name": "tiny", "sae_lens_version": "6.5.0"}, **extra}


def known_directions(x: np.ndarray, d_sae: int, seed: int, b_dec: np.ndarray | None = None,
                     decoder: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """A ReLU SAE whose first len(x) features' encoder columns are the unit directions of x - b_dec
    (rows of x: activations at the hook point), so activation row i fires feature i most; the rest
    random, smaller; decoder rows `decoder` (len(x) of them) then random."""
    n, d_in = x.shape
    rng = np.random.default_rng(seed)
    b = np.zeros(d_in, F32) if b_dec is None else b_dec.astype(F32)
    u = (x - b) / np.linalg.norm(x - b, axis=1, keepdims=True)
    w_enc = (0.5 * rng.standard_normal((d_in, d_sae)) / np.sqrt(d_in)).astype(F32)
    w_enc[:, :n] = u.T
    w_dec = (rng.standard_normal((d_sae, d_in)) / np.sqrt(d_in)).astype(F32)
    if decoder is not None:
        w_dec[:len(decoder)] = decoder
    return {"W_enc": w_enc, "W_dec": w_dec, "b_enc": np.zeros(d_sae, F32), "b_dec": b}


def encode64(t: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """A ReLU SAE's feature activations in float64, from SAELens' equations."""
    w = {k: v.astype(np.float64) for k, v in t.items()}
    return np.maximum((x.astype(np.float64) - w["b_dec"]) @ w["W_enc"] + w["b_enc"], 0.0)


def transcoder_tensors(d_in: int, d_sae: int, seed: int, jumprelu: bool = False, skip: bool = False,
                       scale: float = 1.0) -> dict[str, np.ndarray]:
    """A transcoder's tensors (d_out = d_in), random but of a plausible scale: `scale` is the size of
    the input rows (the MLP's normed input), so that some features fire on a row and some do not."""
    rng = np.random.default_rng(seed)
    t = {"W_enc": (rng.standard_normal((d_in, d_sae)) / np.sqrt(d_in) / scale).astype(F32),
         "W_dec": (rng.standard_normal((d_sae, d_in)) / np.sqrt(d_sae)).astype(F32),
         "b_enc": (0.1 * rng.standard_normal(d_sae)).astype(F32),
         "b_dec": (0.1 * rng.standard_normal(d_in)).astype(F32)}
    if jumprelu:  # mostly positive thresholds, a few negative
        t["threshold"] = (0.3 + 0.3 * rng.standard_normal(d_sae)).astype(F32)
    if skip:
        t["W_skip"] = (0.05 * rng.standard_normal((d_in, d_in)) / scale).astype(F32)
    return t


def transcoder_cfg(d_in: int, d_sae: int, layer: int, jumprelu: bool = False, skip: bool = False,
                   hook_in: str = "ln2.hook_normalized", **extra: Any) -> dict[str, Any]:
    """A transcoder's config as SAELens 6 saves it (hook names under metadata)."""
    arch = ("jumprelu_" if jumprelu else "") + ("skip_" if skip else "") + "transcoder"
    return {"d_in": d_in, "d_sae": d_sae, "d_out": d_in, "dtype": "float32", "device": "cpu",
            "apply_b_dec_to_input": False, "normalize_activations": "none", "reshape_activations": "none",
            "architecture": arch, "metadata": {"hook_name": f"blocks.{layer}.{hook_in}",
                                               "hook_name_out": f"blocks.{layer}.hook_mlp_out",
                                               "model_name": "tiny", "sae_lens_version": "6.5.0"}, **extra}
