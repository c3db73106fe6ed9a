"""Hook point names (TransformerLens style). The hook system proper (capture, interventions) builds
on these; the forward pass already calls every point when, and only when, hooks are given.

Per layer L:  blocks.L.hook_resid_pre -> attn.hook_q / hook_k / hook_v -> hook_attn_out (after o_proj,
before Gemma's post-attention norm) -> hook_resid_mid -> mlp.hook_pre (gate projection) ->
mlp.hook_post (activation * up) -> hook_mlp_out (after down_proj, before Gemma's post-FFN norm) ->
hook_resid_post. Around the layers: hook_embed (after Gemma's sqrt(hidden) scale), hook_final_norm.
"""

from __future__ import annotations

from typing import NamedTuple


class LayerHookNames(NamedTuple):
    resid_pre: str
    q: str
    k: str
    v: str
    attn_out: str
    resid_mid: str
    mlp_pre: str
    mlp_post: str
    mlp_out: str
    resid_post: str


GLOBAL_HOOKS = ("hook_embed", "hook_final_norm")


def layer_hook_names(n_layers: int) -> tuple[LayerHookNames, ...]:
    """Names built once per model, so the forward pass never formats strings."""
    return tuple(
        LayerHookNames(
            f"blocks.{i}.hook_resid_pre", f"blocks.{i}.attn.hook_q", f"blocks.{i}.attn.hook_k",
            f"blocks.{i}.attn.hook_v", f"blocks.{i}.hook_attn_out", f"blocks.{i}.hook_resid_mid",
            f"blocks.{i}.mlp.hook_pre", f"blocks.{i}.mlp.hook_post", f"blocks.{i}.hook_mlp_out",
            f"blocks.{i}.hook_resid_post",
        )
        for i in range(n_layers)
    )


def all_hook_names(n_layers: int) -> list[str]:
    return [GLOBAL_HOOKS[0], *(name for layer in layer_hook_names(n_layers) for name in layer), GLOBAL_HOOKS[1]]
