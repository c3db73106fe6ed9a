"""Where each GGUF-named tensor lives in an HF checkpoint, per architecture.

larql names tensors as GGUF does (`blk.3.attn_q.weight`); an HF checkpoint names them per family,
and two families store some of them fused or transposed:
- Phi-3: q, k and v are row ranges of one `qkv_proj`, gate and up the two halves of `gate_up_proj`;
- GPT-2: `c_attn` holds q, k, v as column ranges, and every projection is a Conv1D stored
  `(in, out)`, the transpose of a Linear's `(out, in)`.
`hf_tensor` says which checkpoint tensor, which rows (after any transpose) and whether to transpose.
GPT-2's fully connected layer plays the gate's part (its activation is the feature's), so it is
read as `ffn_gate` and the model has no `ffn_up`.
"""

from __future__ import annotations

from dataclasses import dataclass

from larql.model.config import ModelConfig


@dataclass(frozen=True)
class HFSlice:
    name: str  # the checkpoint's tensor
    rows: tuple[int, int] | None = None  # rows [a, b) of a fused tensor (of its transpose if conv1d)
    conv1d: bool = False  # stored (in, out) as GPT-2's Conv1D: transposed when read


# GGUF name part -> HF name part, per layer
_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_SANDWICH = {"post_attention_norm": "post_attention_layernorm",
             "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_PLAIN = {"ffn_norm": "post_attention_layernorm"}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
SANDWICH_ARCHS = ("gemma2", "gemma3")

_GPT2_GLOBAL = {"token_embd.weight": "transformer.wte.weight", "position_embd.weight": "transformer.wpe.weight",
                "output_norm.weight": "transformer.ln_f.weight", "output_norm.bias": "transformer.ln_f.bias",
                "output.weight": "lm_head.weight"}
_GPT2_LAYER = {"attn_norm": "ln_1", "ffn_norm": "ln_2", "attn_output": "attn.c_proj", "ffn_gate": "mlp.c_fc",
               "ffn_down": "mlp.c_proj"}


def hf_tensor_name(name: str, arch: str) -> str:
    """The HF checkpoint name of a GGUF-named tensor of a Llama-like or Gemma model:
    `blk.3.ffn_up.weight` -> `model.layers.3.mlp.up_proj.weight`.

    Raises ValueError for a name that is neither global nor `blk.{L}.part.kind`.
    """
    if name in _GLOBAL:
        return _GLOBAL[name]
    _, layer, part, kind = name.split(".", 3)
    layer_map = _SANDWICH if arch in SANDWICH_ARCHS else _PLAIN
    return f"model.layers.{layer}.{layer_map.get(part, _LAYER.get(part, part))}.{kind}"


def hf_tensor(name: str, cfg: ModelConfig) -> HFSlice:
    """Where `name` (GGUF-named) is stored in an HF checkpoint of `cfg`'s architecture.
    Raises ValueError for a malformed name."""
    if cfg.arch == "gpt2":
        return _gpt2(name, cfg)
    if cfg.n_experts and name.startswith("blk."):
        moe = _experts(name, cfg)
        if moe is not None:
            return moe
    if cfg.arch == "phi3" and name.startswith("blk."):
        _, layer, part, kind = name.split(".", 3)
        q, kv, ffn = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.ffn
        fused = {"attn_q": ("self_attn.qkv_proj", (0, q)), "attn_k": ("self_attn.qkv_proj", (q, q + kv)),
                 "attn_v": ("self_attn.qkv_proj", (q + kv, q + 2 * kv)),
                 "ffn_gate": ("mlp.gate_up_proj", (0, ffn)), "ffn_up": ("mlp.gate_up_proj", (ffn, 2 * ffn))}
        if part in fused:
            hf_part, rows = fused[part]
            return HFSlice(f"model.layers.{layer}.{hf_part}.{kind}", rows)
    return HFSlice(hf_tensor_name(name, cfg.arch))


def hf_candidates(name: str, cfg: ModelConfig) -> list[HFSlice]:
    """Where `name` may be stored, most usual first: GPT-2 checkpoints without the `transformer.`
    prefix, Mixtral's experts fused as transformers 5 holds them in memory."""
    where = hf_tensor(name, cfg)
    out = [where]
    if where.name.startswith("transformer."):
        out.append(HFSlice(where.name[len("transformer."):], where.rows, where.conv1d))
    if cfg.n_experts and name.startswith("blk."):
        fused = _fused_experts(name, cfg)
        if fused is not None:
            out.append(fused)
    return out


_EXPERT_PARTS = {"ffn_gate": "w1", "ffn_down": "w2", "ffn_up": "w3"}


def _experts(name: str, cfg: ModelConfig) -> HFSlice | None:
    """Mixtral as checkpoints store it: the router `block_sparse_moe.gate`, expert e's gate, down
    and up as `experts.{e}.w1 / w2 / w3`. larql names them `blk.L.ffn_gate.{e}.weight` and so on."""
    _, layer, part, kind = name.split(".", 3)
    prefix = f"model.layers.{layer}.block_sparse_moe."
    if part == "ffn_gate_inp":
        return HFSlice(f"{prefix}gate.{kind}")
    expert, _, rest = kind.partition(".")
    if part not in _EXPERT_PARTS or not expert.isdigit() or rest != "weight":
        return None
    return HFSlice(f"{prefix}experts.{expert}.{_EXPERT_PARTS[part]}.weight")


def _fused_experts(name: str, cfg: ModelConfig) -> HFSlice | None:
    """Mixtral fused as transformers 5 holds it: the router `mlp.gate`, every expert's gate and up
    stacked in `mlp.experts.gate_up_proj` `(E, 2 ffn, hidden)`, the downs in `down_proj` `(E, hidden, ffn)`."""
    _, layer, part, kind = name.split(".", 3)
    prefix = f"model.layers.{layer}.mlp."
    if part == "ffn_gate_inp":
        return HFSlice(f"{prefix}gate.{kind}")
    expert, _, rest = kind.partition(".")
    if part not in _EXPERT_PARTS or not expert.isdigit() or rest != "weight":
        return None
    e, f, h = int(expert), cfg.ffn, cfg.hidden
    if part == "ffn_down":
        return HFSlice(f"{prefix}experts.down_proj", (e * h, (e + 1) * h))
    first = e * 2 * f + (f if part == "ffn_up" else 0)
    return HFSlice(f"{prefix}experts.gate_up_proj", (first, first + f))


def _gpt2(name: str, cfg: ModelConfig) -> HFSlice:
    if name in _GPT2_GLOBAL:
        return HFSlice(_GPT2_GLOBAL[name])
    _, layer, part, kind = name.split(".", 3)
    prefix = f"transformer.h.{layer}."
    h = cfg.hidden
    qkv = {"attn_q": (0, h), "attn_k": (h, 2 * h), "attn_v": (2 * h, 3 * h)}
    if part in qkv:
        return HFSlice(f"{prefix}attn.c_attn.{kind}", qkv[part], conv1d=kind == "weight")
    hf_part = _GPT2_LAYER.get(part, part)
    return HFSlice(f"{prefix}{hf_part}.{kind}", conv1d=kind == "weight" and "." in hf_part)
