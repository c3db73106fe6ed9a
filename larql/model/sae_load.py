"""SAEs and transcoders read from SAELens' on-disk format: a directory (or a Hub repository's folder)
holding `cfg.json` and `sae_weights.safetensors`, every shape, dtype and value checked, and what
larql does not run refused by name. An SAE's tensors are listed in sae.py; a transcoder (architecture
`transcoder`, `skip_transcoder`, `jumprelu_transcoder` or `jumprelu_skip_transcoder`) has a decoder
of width `d_out` and names its output hook point `hook_name_out` (transcoder.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelFormatError, UnknownModelError, UnsupportedError
from larql.model import hub
from larql.model.sae import SAE
from larql.model.transcoder import TRANSCODER_ARCHITECTURES, Transcoder
from larql.model.weights import read_safetensors_index

__all__ = ["load_sae"]

F32 = NDArray[np.float32]
CFG_FILE, WEIGHTS_FILE = "cfg.json", "sae_weights.safetensors"
ARCHITECTURES = ("standard", "jumprelu", "topk")
_FLOATS = {"F32": np.float32, "F16": np.float16, "F64": np.float64}

def load_sae(path: str | Path) -> SAE:
    """An SAE from a directory in SAELens' format (cfg.json + sae_weights.safetensors), or from a
    Hugging Face Hub repository holding one (`org/name`, or a folder of it: `hf://org/name[@rev]/folder`);
    every shape, dtype and value checked, and what larql does not run refused by name. A transcoder's
    directory gives a `Transcoder` (an SAE whose decoder writes `hook_name_out`).

    Example:
        >>> sae = larql.load_sae("saes/blocks.6.hook_resid_post")
    """
    d = _local_or_hub(path)
    if d.is_file() and d.name in (CFG_FILE, WEIGHTS_FILE):
        d = d.parent
    if not d.is_dir():
        raise ModelFormatError(f"{path}: no SAE directory here (give a directory holding {CFG_FILE} and "
                               f"{WEIGHTS_FILE}, as SAELens' save_model writes, or a Hub id)")
    for name in (CFG_FILE, WEIGHTS_FILE):
        if not (d / name).is_file():
            raise ModelFormatError(f"{d}: no {name} (an SAELens SAE directory holds {CFG_FILE} and {WEIGHTS_FILE})")
    cfg = _read_cfg(d / CFG_FILE)
    where = f"{d / CFG_FILE}"
    d_in, d_sae = _positive_int(cfg, "d_in", where), _positive_int(cfg, "d_sae", where)
    arch, k = _architecture(cfg, where)
    name = _get(cfg, "architecture")
    transcoder = TRANSCODER_ARCHITECTURES.get(name) if isinstance(name, str) else None
    d_out = _positive_int(cfg, "d_out", where) if transcoder else d_in
    tensors = _read_tensors(d / WEIGHTS_FILE)
    w = f"{d / WEIGHTS_FILE}"
    shapes = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_out), "b_enc": (d_sae,), "b_dec": (d_out,)}
    if arch == "jumprelu":
        shapes["threshold"] = (d_sae,)
    if transcoder and transcoder[1]:
        shapes["W_skip"] = (d_out, d_in)
    kind = f"{_get(cfg, 'architecture')} transcoder" if transcoder else f"{arch} SAE"
    widths = f"d_in = {d_in}, d_sae = {d_sae} and d_out = {d_out}" if transcoder else f"d_in = {d_in} and d_sae = {d_sae}"
    for name, shape in shapes.items():
        if name not in tensors:
            raise ModelFormatError(f"{w}: no tensor {name} (a {kind} needs {', '.join(shapes)})")
        if tensors[name].shape != shape:
            raise ModelFormatError(f"{w}: {name} has shape {list(tensors[name].shape)}, but cfg.json's {widths} make it "
                                   f"{list(shape)}")
        if not np.all(np.isfinite(tensors[name])):
            raise ModelFormatError(f"{w}: {name} holds NaN or infinite values (a damaged or diverged SAE)")
    if "W_skip" in tensors and "W_skip" not in shapes:
        raise ModelFormatError(f"{w}: a W_skip tensor (a skip transcoder's), but cfg.json's architecture is "
                               f"{_get(cfg, 'architecture', 'standard')!r}; save it as a skip_transcoder or "
                               f"jumprelu_skip_transcoder")
    scaling = tensors.get("scaling_factor")
    if scaling is not None and not np.all(scaling == 1.0):
        raise UnsupportedError(f"{w}: a finetuning scaling_factor other than 1 is not supported (fold it into W_dec "
                               f"and save the SAE again)")
    if k > d_sae:
        raise ModelFormatError(f"{where}: k = {k} exceeds d_sae = {d_sae}")
    common: dict[str, Any] = {"architecture": arch, "W_enc": tensors["W_enc"], "W_dec": tensors["W_dec"], "b_enc": tensors["b_enc"],
              "b_dec": tensors["b_dec"], "threshold": tensors.get("threshold") if arch == "jumprelu" else None,
              "source": d, "cfg": cfg}
    if transcoder:
        if _flag(cfg, "apply_b_dec_to_input", False, where) or _flag(cfg, "rescale_acts_by_decoder_norm", False, where):
            raise UnsupportedError(f"{where}: a transcoder with apply_b_dec_to_input or rescale_acts_by_decoder_norm "
                                   f"(SAELens refuses them too); save it with both false")
        out = _get(cfg, "hook_name_out")
        if not isinstance(out, str) or not out:
            raise ModelFormatError(f"{where}: a transcoder needs hook_name_out, the hook point it writes "
                                   f"(e.g. blocks.6.hook_mlp_out), at the top level or under metadata")
        return Transcoder(hook_name=_hook_name(cfg, where), hook_name_out=out, W_skip=tensors.get("W_skip"),
                          apply_b_dec_to_input=False, **common)
    return SAE(hook_name=_hook_name(cfg, where), k=k,
               apply_b_dec_to_input=_flag(cfg, "apply_b_dec_to_input", True, where),
               rescale_acts_by_decoder_norm=_flag(cfg, "rescale_acts_by_decoder_norm", False, where), **common)


def _local_or_hub(src: str | Path) -> Path:
    """The directory `src` names: itself when it exists or is not a Hub id, else the folder of the
    Hub repository holding the SAE's two files (downloaded into the Hugging Face cache)."""
    path = Path(src).expanduser()
    parsed = None if isinstance(src, Path) or path.exists() else hub.parse(str(src))
    if parsed is None:
        return path
    repo, rev, folder = parsed
    if folder is not None and folder.rsplit("/", 1)[-1] in (CFG_FILE, WEIGHTS_FILE):
        folder = folder.rsplit("/", 1)[0] if "/" in folder else None
    try:
        import huggingface_hub as hf
    except ImportError as e:
        raise UnknownModelError(f"{src}: Hub ids need huggingface_hub: pip install huggingface_hub") from e
    got = []
    for name in (CFG_FILE, WEIGHTS_FILE):
        file = f"{folder}/{name}" if folder else name
        with hub.hub_errors(str(src), repo, rev, file):
            got.append(Path(hf.hf_hub_download(repo, file, revision=rev)))
    return got[0].parent  # (both files' links are in one snapshot folder)


def _read_cfg(path: Path) -> dict[str, Any]:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFormatError(f"{path}: not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ModelFormatError(f"{path}: not a JSON object")
    return cfg


def _get(cfg: dict[str, Any], key: str, default: Any = None) -> Any:
    """cfg[key], read at the top level or (SAELens 6) under `metadata`."""
    if key in cfg:
        return cfg[key]
    meta = cfg.get("metadata")
    return meta.get(key, default) if isinstance(meta, dict) else default


def _positive_int(cfg: dict[str, Any], key: str, where: str) -> int:
    v = _get(cfg, key)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 1 << 26:
        raise ModelFormatError(f"{where}: {key} must be a positive integer, not {v!r}")
    return v


def _flag(cfg: dict[str, Any], key: str, default: bool, where: str) -> bool:
    v = _get(cfg, key, default)
    if not isinstance(v, bool):
        raise ModelFormatError(f"{where}: {key} must be true or false, not {v!r}")
    return v


def _hook_name(cfg: dict[str, Any], where: str) -> str:
    name = _get(cfg, "hook_name") or _get(cfg, "hook_point")  # (hook_point: SAELens before 6)
    if not isinstance(name, str) or not name:
        raise ModelFormatError(f"{where}: no hook_name (at the top level or under metadata)")
    if _get(cfg, "hook_head_index", _get(cfg, "hook_point_head_index")) is not None:
        raise UnsupportedError(f"{where}: an SAE of one attention head (hook_head_index) is not supported")
    return name


def _architecture(cfg: dict[str, Any], where: str) -> tuple[str, int]:
    """("standard" | "jumprelu" | "topk", k) from the config, refusing what larql does not run."""
    arch = _get(cfg, "architecture", "standard")
    if isinstance(arch, str) and arch in TRANSCODER_ARCHITECTURES:  # the activation it runs; W_skip and d_out are read by load_sae
        arch = TRANSCODER_ARCHITECTURES[arch][0]
    act = _get(cfg, "activation_fn", _get(cfg, "activation_fn_str", "relu"))
    if arch == "standard" and act == "topk":  # SAELens before 6: a standard SAE with a top-k activation
        arch = "topk"
    if arch not in ARCHITECTURES:
        raise UnsupportedError(f"{where}: architecture {arch!r} is not supported (larql runs {', '.join(ARCHITECTURES)} "
                               f"SAEs and {', '.join(TRANSCODER_ARCHITECTURES)})")
    if arch != "topk" and act not in ("relu", None):
        raise UnsupportedError(f"{where}: activation_fn {act!r} is not supported (a {arch} SAE runs relu)")
    norm = _get(cfg, "normalize_activations", "none")
    if norm not in ("none", None, False):
        raise UnsupportedError(f"{where}: normalize_activations {norm!r} is not supported; fold the scaling into the "
                               f"weights (SAELens: fold_activation_norm_scaling_factor) and save with 'none'")
    if _get(cfg, "reshape_activations", "none") not in ("none", None):
        raise UnsupportedError(f"{where}: reshape_activations {_get(cfg, 'reshape_activations')!r} (hook_z SAEs) "
                               f"is not supported")
    if _get(cfg, "finetuning_scaling_factor", False):
        raise UnsupportedError(f"{where}: finetuning_scaling_factor is not supported (fold it into W_dec)")
    k = 0
    if arch == "topk":
        kwargs = _get(cfg, "activation_fn_kwargs") or {}
        k = _get(cfg, "k", kwargs.get("k") if isinstance(kwargs, dict) else None)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ModelFormatError(f"{where}: a topk SAE needs k, a positive integer (not {k!r})")
    return arch, k


def _read_tensors(path: Path) -> dict[str, F32]:
    """Every float tensor of the weights file as float32 (F16, BF16 and F64 converted)."""
    out: dict[str, F32] = {}
    for name, (data, dtype, shape, start, end) in read_safetensors_index(path).items():
        raw = data[start:end]
        if dtype == "BF16":
            a = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dtype in _FLOATS:
            a = raw.view(_FLOATS[dtype]).astype(np.float32)
        else:
            raise ModelFormatError(f"{path}: tensor {name} has dtype {dtype}; an SAE's tensors are F32, F16, BF16 or F64")
        out[name] = np.ascontiguousarray(a.reshape(shape))
    return out


