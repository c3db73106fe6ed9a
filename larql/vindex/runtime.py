"""The model an inference-level vindex carries: its config from index.json, its weights from
weights.bin, its tokenizer from tokenizer.json; the FFN is dense unless an edit strategy is given."""

from __future__ import annotations

from larql.errors import VindexError
from larql.model.config import ModelConfig
from larql.model.ffn import FFNEdits
from larql.model.model import Model
from larql.model.weights import load_weights
from larql.vindex.store import Vindex
from larql.vindex.weights import VindexWeightSource


def carried_model(v: Vindex, edits: FFNEdits | None = None) -> Model:
    """A new Model over `v`'s weights (memory-mapped, nothing copied), its FFN edited by `edits`.

    Example:
        >>> carried_model(open_vindex("g.vindex")).generate("The capital of France is", 4).text
    """
    cfg = index_config(v)
    weights = load_weights(VindexWeightSource(v.path), cfg)
    return Model(v.index["model"], v.path, cfg, weights, v.tokenizer, edits)


def index_config(v: Vindex) -> ModelConfig:
    """The ModelConfig index.json records for an inference-level vindex."""
    if not v.has_model_weights:
        parts = v.index.get("parts") or ()
        if "attention" in parts and "ffn" not in parts:  # a client slice: attention here, the FFN elsewhere
            raise VindexError(f"{v.path}: a client slice holds attention but no FFN weights, and larql runs a "
                              f"model from a vindex with all of them; run the vindex it was sliced from "
                              f"({v.index.get('sliced_from', {}).get('path', 'its source')}) with --ffn URL "
                              f"to take the FFN from a server")
        raise VindexError(f"{v.path}: a browse-level vindex has no model weights; "
                          f"re-extract with --level inference to run the model from it")
    mc = dict(v.index["model_config"])
    mc["global_layers"] = tuple(mc["global_layers"])
    for key in ("rope_freq_factors", "rope_short_factors", "rope_long_factors"):
        if key in mc:  # a JSON list, a tuple in the (frozen, hashable) config
            mc[key] = tuple(mc[key])
    try:
        cfg = ModelConfig(**mc)
    except TypeError as e:
        raise VindexError(f"{v.path / 'index.json'}: model_config does not describe a model this larql "
                          f"runs ({e})") from e
    if v.num_layers != cfg.n_layers or v.hidden != cfg.hidden:
        raise VindexError(f"{v.path}: this vindex does not match the model "
                          f"({v.num_layers} layers x {v.hidden} vs {cfg.n_layers} x {cfg.hidden})")
    return cfg
