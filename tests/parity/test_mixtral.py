"""Mixtral beyond the logits (those are in test_architectures.py): the experts fused as transformers
5 holds them load to the same model, the router is a hook point, and what larql cannot do with a
mixture of experts yet (a vindex, weight edits) is refused, not done wrongly."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import larql
from larql.errors import UnsupportedError
from larql.model.hooks import Zero
from larql.vindex.extract import extract

REF = Path(__file__).resolve().parents[1] / "golden" / "architectures" / "mixtral"


def test_fused_experts_load_to_the_same_model(tmp_path: Path) -> None:
    m = larql.load(REF)
    t = load_file(str(REF / "model.safetensors"))
    fused: dict[str, np.ndarray] = {}
    for i in range(m.config.n_layers):
        p = f"model.layers.{i}.block_sparse_moe."
        experts = range(m.config.n_experts)
        fused[f"model.layers.{i}.mlp.gate.weight"] = t.pop(p + "gate.weight")
        fused[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([t.pop(f"{p}experts.{e}.w1.weight"), t.pop(f"{p}experts.{e}.w3.weight")]) for e in experts])
        downs = [t.pop(f"{p}experts.{e}.w2.weight") for e in experts]
        fused[f"model.layers.{i}.mlp.experts.down_proj"] = np.stack(downs)
    d = tmp_path / "fused"
    shutil.copytree(REF, d)
    save_file(t | fused, str(d / "model.safetensors"))
    ids = np.load(REF.parent / "mixtral.npz")["p1.ids"]
    assert np.array_equal(larql.load(d).forward(ids), m.forward(ids))


def test_router_hook_sees_and_steers_the_routing() -> None:
    m = larql.load(REF)
    ids = np.load(REF.parent / "mixtral.npz")["p1.ids"]
    _, cache = m.run_with_cache(ids, ["blocks.0.mlp.hook_router"])
    assert cache["blocks.0.mlp.hook_router"].shape == (len(ids), m.config.n_experts)
    # a router that prefers no expert still picks k of them: the output changes, nothing breaks
    assert not np.allclose(m.forward(ids, hooks={"blocks.0.mlp.hook_router": Zero()}), m.forward(ids))


def test_no_vindex_and_no_weight_edits_yet(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match=r"mixtral: a mixture-of-experts model \(4 experts per layer\) has no "
                                               r"vindex layout yet"):
        extract(REF, tmp_path / "m.vindex", level="browse")
    from larql.model.grad import Tail

    m = larql.load(REF)
    with pytest.raises(UnsupportedError, match="weight edits .* cannot run on mixtral: its mixture of experts"):
        Tail(m.config, m.weights, 1)


@pytest.mark.parametrize("arch", ["mixtral", "gpt2"])
def test_run_with_cache_captures_exactly_the_points_reached(arch: str) -> None:
    m = larql.load(REF.parent / arch)
    _, cache = m.run_with_cache(np.load(REF.parent / f"{arch}.npz")["p1.ids"])
    assert list(cache) == m.hook_names()
    assert ("blocks.0.mlp.hook_router" in cache) == (arch == "mixtral")
    assert ("blocks.0.attn.hook_rot_q" in cache) == (arch != "gpt2")
