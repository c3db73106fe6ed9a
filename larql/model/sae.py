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
HookedSAETransformer. sae_load.py reads the files (`load_sae`); transcoder.py holds the transcoders,
SAEs whose decoder writes another hook point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelError, UnsupportedError
from larql.model.config import ModelConfig
from larql.model.hf_names import SANDWICH_ARCHS
from larql.model.hooks import Add, Positions, hook_name

__all__ = ["SAE", "SAE_POINTS", "attach_saes", "check_saes", "feature_hook_names"]

F32 = NDArray[np.float32]
SAE_POINTS = ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_error",
              "hook_sae_output")
# the hook points an SAE attaches to, (T, width) each: hidden-wide ones, and the MLP's hidden layer (ffn-wide)
_HIDDEN_KINDS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out")
_FFN_KINDS = ("mlp.hook_pre", "mlp.hook_post")


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

    @property
    def d_out(self) -> int:
        """The width its decoder writes: d_in for an SAE, the output hook point's for a transcoder."""
        return int(self.W_dec.shape[1])

    @property
    def kind(self) -> str:
        """What it is, as SHOW SAES lists it: "SAE" here, "transcoder" / "skip transcoder" in transcoder.py."""
        return "SAE"

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
