"""Sparse autoencoders in SAELens' on-disk format, run inside the forward pass at their hook point.

A directory holds `cfg.json` and `sae_weights.safetensors`:
    W_enc (d_in, d_sae)   b_enc (d_sae,)   W_dec (d_sae, d_in)   b_dec (d_in,)   threshold (d_sae,), JumpReLU only
The equations (SAELens' StandardSAE, JumpReLUSAE and TopKSAE):
    pre  = (x - b_dec * apply_b_dec_to_input) @ W_enc + b_enc                    (T, d_sae)
    acts = relu(pre)                         "standard" (relu)
         = relu(pre) * (pre > relu(threshold))   "jumprelu"
         = relu of the k largest pre per row, 0 elsewhere   "topk" (pre * |W_dec| rows first when
                                             rescale_acts_by_decoder_norm, and acts / |W_dec| after)
    x_hat = acts @ W_dec + b_dec                                                  (T, d_in)
Attached to a forward pass (`Model.forward(ids, saes=[sae])`), the model runs on x_hat at the hook
point (or on x_hat + (x - x_hat) = x with the error term); the cache names its values
`{hook_name}.hook_sae_input / acts_pre / acts_post / recons / error / output`, and a hook
named `{hook_name}.hook_sae_acts_post` edits the features before decoding, as with SAELens'
HookedSAETransformer. A directory may also be a folder of a Hugging Face Hub repository.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelError, ModelFormatError, UnknownModelError, UnsupportedError
from larql.model import hub
from larql.model.config import ModelConfig
from larql.model.hf_names import SANDWICH_ARCHS
from larql.model.hooks import Add, Positions, hook_name
from larql.model.weights import read_safetensors_index

__all__ = ["SAE", "SAE_POINTS", "attach_saes", "check_saes", "feature_hook_names", "load_sae"]

F32 = NDArray[np.float32]
CFG_FILE, WEIGHTS_FILE = "cfg.json", "sae_weights.safetensors"
SAE_POINTS = ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_error",
              "hook_sae_output")
ARCHITECTURES = ("standard", "jumprelu", "topk")
# the hook points an SAE attaches to, (T, width) each: hidden-wide ones, and the MLP's hidden layer (ffn-wide)
_HIDDEN_KINDS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out")
_FFN_KINDS = ("mlp.hook_pre", "mlp.hook_post")
_FLOATS = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


@dataclass(frozen=True, eq=False)
class SAE:
    """A sparse autoencoder at one hook point. Build one with `load_sae(path)`.

    Example:
        >>> sae = larql.load_sae("saes/blocks.6.hook_resid_post")
        >>> logits, cache = m.run_with_cache(ids, saes=[sae])
        >>> cache[f"{sae.hook_name}.hook_sae_acts_post"].shape   # (T, d_sae)
    """

    hook_name: str
    architecture: str  # "standard" (ReLU), "jumprelu" or "topk"
    W_enc: F32  # (d_in, d_sae)
    W_dec: F32  # (d_sae, d_in)
    b_enc: F32  # (d_sae,)
    b_dec: F32  # (d_in,)
    threshold: F32 | None = None  # (d_sae,), JumpReLU only
    k: int = 0  # top-k only
    apply_b_dec_to_input: bool = True
    rescale_acts_by_decoder_norm: bool = False  # top-k only
    source: Path | None = None
    cfg: dict[str, Any] = field(default_factory=dict)  # cfg.json as read

    @property
    def d_in(self) -> int:
        return int(self.W_enc.shape[0])

    @property
    def d_sae(self) -> int:
        return int(self.W_enc.shape[1])

    def __repr__(self) -> str:
        k = f", k={self.k}" if self.architecture == "topk" else ""
        return f"SAE({self.hook_name!r}, {self.architecture}, d_in={self.d_in}, d_sae={self.d_sae}{k})"

    def hidden_pre(self, x: F32) -> F32:
        """The encoder's pre-activations `(T, d_sae)` of activations x `(T, d_in)`."""
        x = np.asarray(x, dtype=np.float32)
        if x.shape[-1] != self.d_in:
            raise ModelError(f"{self}: input of width {x.shape[-1]}, expected d_in = {self.d_in}")
        sae_in = x - self.b_dec if self.apply_b_dec_to_input else x  # (T, d_in)
        pre = sae_in @ self.W_enc + self.b_enc  # (T, d_sae)
        if self.rescale_acts_by_decoder_norm:
            pre = pre * self._dec_norm()
        return pre.astype(np.float32, copy=False)

    def activate(self, pre: F32) -> F32:
        """Feature activations `(T, d_sae)` from pre-activations (the architecture's nonlinearity)."""
        acts = np.maximum(pre, np.float32(0.0))  # (T, d_sae)
        if self.architecture == "jumprelu":
            assert self.threshold is not None
            acts = np.where(pre > np.maximum(self.threshold, np.float32(0.0)), acts, np.float32(0.0))
        elif self.architecture == "topk" and self.k < self.d_sae:
            flat = acts.reshape(-1, self.d_sae)
            drop = np.argpartition(-pre.reshape(-1, self.d_sae), self.k - 1, axis=1)[:, self.k:]  # all but the k largest pre
            flat = flat.copy()
            np.put_along_axis(flat, drop, np.float32(0.0), axis=1)
            acts = flat.reshape(acts.shape)
        return acts.astype(np.float32, copy=False)

    def encode(self, x: F32) -> F32:
        """Feature activations `(T, d_sae)` of activations x `(T, d_in)` at the hook point."""
        return self.activate(self.hidden_pre(x))

    def decode(self, acts: F32) -> F32:
        """The reconstruction `(T, d_in)` of feature activations `(T, d_sae)`."""
        acts = np.asarray(acts, dtype=np.float32)
        if self.rescale_acts_by_decoder_norm:
            acts = acts / self._dec_norm()
        return (acts @ self.W_dec + self.b_dec).astype(np.float32, copy=False)  # (T, d_in)

    def __call__(self, x: F32) -> F32:
        """x through the SAE: decode(encode(x))."""
        return self.decode(self.encode(x))

    def steer(self, feature: int, scale: float, positions: Positions = None) -> dict[str, Add]:
        """A hook spec adding `scale` times feature `feature`'s decoder direction at the SAE's hook
        point (at `positions`, absolute; None: all), for `forward` / `generate(hooks=...)`.

        Example:
            >>> m.generate("I think that", 8, hooks=sae.steer(123, 8.0)).text
        """
        if not 0 <= feature < self.d_sae:
            raise ModelError(f"{self}: feature {feature} is out of range (0-{self.d_sae - 1})")
        return {self.hook_name: Add((np.float32(scale) * self.W_dec[feature]).astype(np.float32), positions)}

    def _dec_norm(self) -> F32:
        return np.linalg.norm(self.W_dec, axis=1).astype(np.float32)  # (d_sae,)


# ---- loading ------------------------------------------------------------------------------------

def load_sae(path: str | Path) -> SAE:
    """An SAE from a directory in SAELens' format (cfg.json + sae_weights.safetensors), or from a
    Hugging Face Hub repository holding one (`org/name`, or a folder of it: `hf://org/name[@rev]/folder`);
    every shape, dtype and value checked, and what larql does not run refused by name.

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
    tensors = _read_tensors(d / WEIGHTS_FILE)
    w = f"{d / WEIGHTS_FILE}"
    shapes = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_in), "b_enc": (d_sae,), "b_dec": (d_in,)}
    if arch == "jumprelu":
        shapes["threshold"] = (d_sae,)
    for name, shape in shapes.items():
        if name not in tensors:
            raise ModelFormatError(f"{w}: no tensor {name} (a {arch} SAE needs {', '.join(shapes)})")
        if tensors[name].shape != shape:
            raise ModelFormatError(f"{w}: {name} has shape {list(tensors[name].shape)}, but cfg.json's d_in = {d_in} "
                                   f"and d_sae = {d_sae} make it {list(shape)}")
        if not np.all(np.isfinite(tensors[name])):
            raise ModelFormatError(f"{w}: {name} holds NaN or infinite values (a damaged or diverged SAE)")
    if "W_skip" in tensors:
        raise UnsupportedError(f"{w}: a W_skip tensor (a skip transcoder); larql runs SAEs, not transcoders, yet")
    scaling = tensors.get("scaling_factor")
    if scaling is not None and not np.all(scaling == 1.0):
        raise UnsupportedError(f"{w}: a finetuning scaling_factor other than 1 is not supported (fold it into W_dec "
                               f"and save the SAE again)")
    if k > d_sae:
        raise ModelFormatError(f"{where}: k = {k} exceeds d_sae = {d_sae}")
    return SAE(hook_name=_hook_name(cfg, where), architecture=arch,
               W_enc=tensors["W_enc"], W_dec=tensors["W_dec"], b_enc=tensors["b_enc"], b_dec=tensors["b_dec"],
               threshold=tensors.get("threshold") if arch == "jumprelu" else None, k=k,
               apply_b_dec_to_input=_flag(cfg, "apply_b_dec_to_input", True, where),
               rescale_acts_by_decoder_norm=_flag(cfg, "rescale_acts_by_decoder_norm", False, where),
               source=d, cfg=cfg)


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
    act = _get(cfg, "activation_fn", _get(cfg, "activation_fn_str", "relu"))
    if arch == "standard" and act == "topk":  # SAELens before 6: a standard SAE with a top-k activation
        arch = "topk"
    if arch not in ARCHITECTURES:
        raise UnsupportedError(f"{where}: architecture {arch!r} is not supported (larql runs {', '.join(ARCHITECTURES)})")
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


# ---- in the forward pass ------------------------------------------------------------------------

def check_saes(saes: Sequence[SAE], cfg: ModelConfig, reached: Sequence[str]) -> None:
    """Refuse, by name, an SAE whose hook point this model lacks or whose d_in is not its width."""
    for sae in saes:
        if not isinstance(sae, SAE):
            raise ModelError(f"saes= takes SAE values (larql.load_sae(path)), not {type(sae).__name__}")
        h = hook_name(sae.hook_name, cfg.n_layers, cfg.n_experts)  # an unknown name: an error naming near ones
        if str(h) not in reached:
            raise ModelError(f"{sae}: this model never reaches {h} (see Model.hook_names())")
        if h.layer is None or h.kind in _HIDDEN_KINDS:
            width = cfg.hidden
        elif h.kind in _FFN_KINDS:
            width = cfg.ffn
        else:
            raise UnsupportedError(f"{sae}: an SAE attaches to a (T, width) hook point: the residual stream, "
                                   f"attn/mlp out or mlp.hook_pre/post, not {h}")
        if cfg.arch in SANDWICH_ARCHS and h.kind in ("hook_attn_out", "hook_mlp_out"):
            raise UnsupportedError(f"{sae}: on {cfg.arch}, larql's {h} is before the sublayer's post-norm, and "
                                   f"TransformerLens's (where SAELens SAEs are trained) after it; use an SAE on "
                                   f"the residual stream (hook_resid_mid / hook_resid_post) or on mlp.hook_post")
        if width != sae.d_in:
            raise ModelError(f"{sae}: d_in = {sae.d_in}, but {h} of this model has width {width} "
                             f"(an SAE trained for another model, or for another hook point)")


HookFn = Callable[[F32, str, int], "F32 | None"]


def feature_hook_names(saes: Sequence[SAE]) -> set[str]:
    """The names under which a hook spec may edit each SAE's feature activations."""
    return {f"{sae.hook_name}.hook_sae_acts_post" for sae in saes}


def attach_saes(saes: Sequence[SAE], fns: dict[str, HookFn] | None, use_error_term: bool,
                cache: dict[str, list[F32]] | None = None,
                feature_fns: Mapping[str, HookFn] | None = None) -> dict[str, HookFn] | None:
    """Hook fns running each SAE at its hook point, after any hook already there: the model goes on
    with the reconstruction (with the error term: plus x minus the unedited reconstruction, which is
    x itself when no feature is edited). `feature_fns` edit the feature activations (keys
    `{hook_name}.hook_sae_acts_post`) before they are decoded; `cache`, when given, collects every
    SAE_POINTS value under `{hook_name}.{point}` (the activations and reconstruction as edited)."""
    if not saes:
        return fns
    out = dict(fns or {})
    for sae in saes:
        inner = out.get(sae.hook_name)
        acts_name = f"{sae.hook_name}.hook_sae_acts_post"
        edit = (feature_fns or {}).get(acts_name)

        def fn(x: F32, hook: str, start: int, sae: SAE = sae, inner: HookFn | None = inner,
               edit: HookFn | None = edit, acts_name: str = acts_name) -> F32:
            if inner is not None:
                got = inner(x, hook, start)
                x = x if got is None else got
            pre = sae.hidden_pre(x)  # (T, d_sae)
            acts = sae.activate(pre)  # (T, d_sae)
            recons = sae.decode(acts)  # (T, d_in)
            error = x - recons  # (T, d_in)
            edit_made = False
            if edit is not None:
                got = edit(acts, acts_name, start)
                if got is not None and got is not acts:
                    acts, recons, edit_made = got, sae.decode(got), True
            if not use_error_term:
                y = recons
            else:  # recons + (x - recons) is x: exact, not rounded
                y = recons + error if edit_made else x
            if cache is not None:
                for point, value in zip(SAE_POINTS, (x, pre, acts, recons, error, y)):
                    cache.setdefault(f"{sae.hook_name}.{point}", []).append(value)
            return y

        out[sae.hook_name] = fn
    return out
