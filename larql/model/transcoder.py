"""Transcoders in SAELens' format, run in place of a layer's MLP.

A transcoder reads the MLP's normed input x and writes a reconstruction of the MLP's output
(SAELens' Transcoder, SkipTranscoder, JumpReLUTranscoder and JumpReLUSkipTranscoder):
    pre  = x @ W_enc + b_enc                                          (T, d_sae)
    acts = relu(pre)  ("transcoder"),  relu(pre) * (pre > threshold)  ("jumprelu_transcoder")
    out  = acts @ W_dec + b_dec  (+ x @ W_skip.T for a skip transcoder)   (T, d_out)
    W_enc (d_in, d_sae)  W_dec (d_sae, d_out)  b_enc (d_sae,)  b_dec (d_out,)  W_skip (d_out, d_in)
Its input hook, in SAELens' and TransformerLens' names, is `blocks.L.ln2.hook_normalized`,
`blocks.L.hook_mlp_in` (Gemma Scope 2's, read as the pre-FFN norm's output its config names) or
`blocks.L.mlp.hook_in`: the normed residual the MLP reads, its norm weight applied (TransformerLens
with fold_ln off). Its output hook is `blocks.L.hook_mlp_out` as TransformerLens names it: the MLP's
output as added to the residual, so after Gemma's post-FFN norm (larql's own hook_mlp_out is before it).

In a forward pass (`Model.forward(ids, saes=[transcoder])`) the layer's residual goes on with
resid_mid + out instead of resid_mid + the MLP's output; with the error term, with the MLP's
output (out + (mlp - out), exact). The cache and the feature hook are an SAE's (sae.py), named
after the input hook: `{hook_name}.hook_sae_input` is x, `.hook_sae_recons` is out, `.hook_sae_error`
the MLP's output minus out, `.hook_sae_output` what the residual adds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelError, UnsupportedError
from larql.model.config import ModelConfig
from larql.model.forward import norm, rms_norm
from larql.model.hooks import Add, Positions
from larql.model.sae import SAE, SAE_POINTS, HookFn
from larql.model.weights import LayerWeights

__all__ = ["TRANSCODER_ARCHITECTURES", "Transcoder", "attach_transcoders", "check_transcoders", "mlp_layer"]

F32 = NDArray[np.float32]
# SAELens' transcoder architectures: (the activation, whether it has W_skip)
TRANSCODER_ARCHITECTURES = {"transcoder": ("standard", False), "skip_transcoder": ("standard", True),
                            "jumprelu_transcoder": ("jumprelu", False),
                            "jumprelu_skip_transcoder": ("jumprelu", True)}
IN_KINDS = ("ln2.hook_normalized", "hook_mlp_in", "mlp.hook_in")  # the MLP's normed input
OUT_KINDS = ("hook_mlp_out",)  # the MLP's output as the residual adds it


@dataclass(frozen=True, eq=False)
class Transcoder(SAE):
    """A transcoder: an SAE encoding the MLP's input at `hook_name` and decoding its output at
    `hook_name_out`. Build one with `load_sae(path)` on a transcoder's directory.

    Example:
        >>> tc = larql.load_sae("transcoders/layer_6")
        >>> m.forward(ids, saes=[tc])                        # layer 6's MLP replaced by the transcoder
        >>> _, cache = m.run_with_cache(ids, saes=[tc], use_error_term=True)
        >>> cache[tc.hook_name + ".hook_sae_acts_post"]          # its feature activations
    """

    hook_name_out: str = ""
    W_skip: F32 | None = None  # (d_out, d_in), skip transcoders only

    @property
    def kind(self) -> str:
        return "skip transcoder" if self.W_skip is not None else "transcoder"

    def __repr__(self) -> str:
        return (f"Transcoder({self.hook_name!r} -> {self.hook_name_out!r}, {self.architecture}"
                f"{', skip' if self.W_skip is not None else ''}, d_in={self.d_in}, d_sae={self.d_sae}, "
                f"d_out={self.d_out})")

    def output(self, x: F32, acts: F32) -> F32:
        """The transcoder's output `(T, d_out)` from its input x `(T, d_in)` and features acts `(T, d_sae)`."""
        out = self.decode(acts)  # (T, d_out)
        if self.W_skip is not None:
            out = out + np.asarray(x, dtype=np.float32) @ self.W_skip.T  # (T, d_out)
        return out.astype(np.float32, copy=False)

    def __call__(self, x: F32) -> F32:
        """The output for input x: output(x, encode(x))."""
        return self.output(x, self.encode(x))

    def steer(self, feature: int, scale: float, positions: Positions = None) -> dict[str, Add]:
        """A hook spec adding `scale` times feature `feature`'s decoder direction to its layer's MLP
        output (at hook_resid_post, where that output has been added), for `forward` / `generate(hooks=...)`."""
        spec = super().steer(feature, scale, positions)
        layer = _layer(self.hook_name_out, OUT_KINDS)
        if layer is None:
            raise ModelError(f"{self}: its output hook {self.hook_name_out} is not an MLP's output")
        return {f"blocks.{layer}.hook_resid_post": spec[self.hook_name]}


def _layer(name: str, kinds: tuple[str, ...]) -> int | None:
    """L of `blocks.L.<kind>` for a kind in `kinds`, else None."""
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() and parts[2] in kinds:
        return int(parts[1])
    return None


def mlp_layer(tc: Transcoder) -> int:
    """The layer whose MLP the transcoder stands in for (refusing names larql does not map)."""
    layer_in, layer_out = _layer(tc.hook_name, IN_KINDS), _layer(tc.hook_name_out, OUT_KINDS)
    if layer_in is None:
        raise UnsupportedError(f"{tc}: input hook {tc.hook_name} is not an MLP's input; larql runs transcoders "
                               f"reading blocks.L.{' / '.join(IN_KINDS)}")
    if layer_out is None:
        raise UnsupportedError(f"{tc}: output hook {tc.hook_name_out} is not an MLP's output; larql runs "
                               f"transcoders writing blocks.L.hook_mlp_out")
    if layer_in != layer_out:
        raise UnsupportedError(f"{tc}: reads layer {layer_in} and writes layer {layer_out} (a cross-layer "
                               f"transcoder); larql runs transcoders replacing one layer's MLP")
    return layer_in


def check_transcoders(tcs: Sequence[Transcoder], cfg: ModelConfig) -> None:
    """Refuse, by name, a transcoder whose layer this model lacks, whose widths are not its hidden
    size, or two standing in for one MLP."""
    seen: dict[int, Transcoder] = {}
    for tc in tcs:
        layer = mlp_layer(tc)
        if layer >= cfg.n_layers:
            raise ModelError(f"{tc}: layer {layer} is out of range (this model has layers 0-{cfg.n_layers - 1})")
        for what, width in (("d_in", tc.d_in), ("d_out", tc.d_out)):
            if width != cfg.hidden:
                raise ModelError(f"{tc}: {what} = {width}, but the MLP of this model reads and writes width "
                                 f"{cfg.hidden} (a transcoder trained for another model)")
        if layer in seen:
            raise ModelError(f"{tc} and {seen[layer]} both replace layer {layer}'s MLP; attach one of them")
        seen[layer] = tc


def attach_transcoders(tcs: Sequence[Transcoder], fns: dict[str, HookFn] | None, use_error_term: bool,
                       cfg: ModelConfig, layers: Sequence[LayerWeights], cache: dict[str, list[F32]] | None = None,
                       feature_fns: Mapping[str, HookFn] | None = None) -> dict[str, HookFn] | None:
    """Hook fns running each transcoder in place of its layer's MLP: at hook_resid_mid the MLP's
    input is kept, at hook_mlp_out the MLP's output, and at hook_resid_post the residual becomes
    resid_mid + the transcoder's output (+ the error term: unchanged when no feature is edited),
    before any hook already at hook_resid_post; hooks at the other two run first. `feature_fns`
    and `cache` as in sae.attach_saes."""
    if not tcs:
        return fns
    out = dict(fns or {})
    for tc in tcs:
        layer = mlp_layer(tc)
        lw = layers[layer]
        mid_name, mlp_name, post_name = (f"blocks.{layer}.{k}" for k in ("hook_resid_mid", "hook_mlp_out",
                                                                          "hook_resid_post"))
        kept: dict[str, F32] = {}
        acts_name = f"{tc.hook_name}.hook_sae_acts_post"
        edit = (feature_fns or {}).get(acts_name)
        post_inner = out.get(post_name)

        def keep(x: F32, hook: str, start: int, inner: HookFn | None, kept: dict[str, F32] = kept) -> F32:
            if inner is not None:
                got = inner(x, hook, start)
                x = x if got is None else got
            kept[hook] = x
            return x

        def splice(x: F32, hook: str, start: int, tc: Transcoder = tc, lw: LayerWeights = lw,
                   inner: HookFn | None = post_inner, kept: dict[str, F32] = kept,
                   names: tuple[str, str] = (mid_name, mlp_name), edit: HookFn | None = edit,
                   acts_name: str = acts_name) -> F32:
            mid, mlp = kept.pop(names[0]), kept.pop(names[1])  # (T, hidden) each
            h = norm(cfg, mid, lw.ffn_norm, lw.ffn_norm_bias)  # (T, hidden) the MLP's input, as mlp_block's
            true = mlp if lw.post_ffn_norm is None else rms_norm(mlp, lw.post_ffn_norm, cfg.norm_eps)  # (T, hidden)
            pre = tc.hidden_pre(h)  # (T, d_sae)
            acts = tc.activate(pre)  # (T, d_sae)
            recons = tc.output(h, acts)  # (T, hidden)
            error = true - recons  # (T, hidden)
            edit_made = False
            if edit is not None:
                got = edit(acts, acts_name, start)
                if got is not None and got is not acts:
                    acts, recons, edit_made = got, tc.output(h, got), True
            if not use_error_term:
                y = recons
                x = mid + y  # (T, hidden) the residual with the transcoder's output for the MLP's
            elif edit_made:
                y = recons + error
                x = mid + y
            else:  # recons + (true - recons) is the MLP's output: x as the model made it, exact
                y = true
            if cache is not None:
                for point, value in zip(SAE_POINTS, (h, pre, acts, recons, error, y)):
                    cache.setdefault(f"{tc.hook_name}.{point}", []).append(value)
            if inner is not None:
                got = inner(x, hook, start)
                x = x if got is None else got
            return x

        for name in (mid_name, mlp_name):
            out[name] = partial(keep, inner=out.get(name))
        out[post_name] = splice
    return out
