"""FFN shards as Ray actors on a real local cluster: layer ranges of gemma3-270m and expert ranges of
the tiny Mixtral give the local model bit for bit (logits, hook captures, greedy decode through the
KV cache), a client's edits reach the shard, and what the shards cannot do is refused in one line."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import larql
from larql.edit.patches.overlay import FeatureOverride
from larql.errors import RemoteError, ServeError, UnsupportedError
from larql.grid.client import RayGrid
from larql.grid.cluster import import_ray
from tests.cli.conftest import larql as run_larql
from tests.conftest import golden
from tests.grid.conftest import MIXTRAL, SMALL

pytestmark = pytest.mark.usefixtures("cluster")


def test_gemma_layers_4_to_11_on_two_actors_equal_local(fresh_budget: None) -> None:
    local = larql.load("gemma3-270m")
    grid = RayGrid.start(str(local.source), local, "4-7,8-11", options=SMALL)
    try:
        remote = grid.attach(local)
        ids = local.tokenize("The capital of France is")
        assert np.array_equal(remote.forward(ids), local.forward(ids))
        names = [f"blocks.{i}.hook_mlp_out" for i in (3, 4, 9, 11)] + ["blocks.8.hook_resid_post"]
        _, got = remote.run_with_cache(ids, names)
        _, want = local.run_with_cache(ids, names)
        assert all(np.array_equal(got[n], want[n]) for n in names)
        ref = golden("gemma3-270m", "hf")[0]
        out = remote.generate(ref["prompt"], max_new_tokens=8).ids  # prefill, then seven decode steps on the cache
        assert out == local.generate(ref["prompt"], max_new_tokens=8).ids == ref["greedy24_ids"][:8]
        # each of its four layers in the forward pass, the cached run and eight steps; the first shard's info too
        assert [c for _, c in grid.calls()] == [[1 + 4 * 10], [4 * 10]]
        with pytest.raises(UnsupportedError, match="layer 5's FFN runs on the Ray shard of layers 4-7"):
            remote.forward(ids, hooks={"blocks.5.mlp.hook_post": lambda x, name: x})
        remote.forward(ids, hooks={"blocks.2.mlp.hook_post": lambda x, name: x})  # a local layer keeps its hooks
    finally:
        grid.close()


@pytest.fixture(scope="module")
def hollow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Mixtral with every expert's weights zeroed: only the shards can compute them."""
    d = tmp_path_factory.mktemp("hollow") / "mixtral"
    shutil.copytree(MIXTRAL, d)
    t = load_file(str(MIXTRAL / "model.safetensors"))
    save_file({k: np.zeros_like(v) if ".experts." in k else v for k, v in t.items()}, str(d / "model.safetensors"))
    return d


def test_mixtral_experts_split_over_actors_equal_local(hollow: Path) -> None:
    local = larql.load(MIXTRAL)
    ids = [int(i) for i in np.load(MIXTRAL.parent / "mixtral.npz")["p1.ids"]]
    want = local.forward(ids)
    client = larql.load(hollow)
    assert not np.allclose(client.forward(ids), want)  # without its experts the client is another model
    grid = RayGrid.start(str(MIXTRAL), client, experts="0-1,2-3", options=SMALL)
    try:
        remote = grid.attach(client)
        assert np.array_equal(remote.forward(ids), want)
        assert remote.generate(ids, max_new_tokens=5).ids == local.generate(ids, max_new_tokens=5).ids
        _, got = remote.run_with_cache(ids, ["blocks.1.mlp.hook_router", "blocks.1.hook_mlp_out"])
        _, ref = local.run_with_cache(ids, ["blocks.1.mlp.hook_router", "blocks.1.hook_mlp_out"])
        assert all(np.array_equal(got[k], ref[k]) for k in ref)  # the router and its hooks run on the client
        half = RayGrid.start(str(MIXTRAL), local, "1-1", "2-3", options=SMALL)  # one layer's experts 2-3 only
        try:
            assert np.array_equal(half.attach(local).forward(ids), want)
        finally:
            half.close()
    finally:
        grid.close()


def test_the_clients_edits_reach_the_shard(tiny_vx: Path) -> None:
    view = larql.edit_vindex(tiny_vx)
    model = view.model()  # the walk FFN over the view's overlay: edits show at once
    ids = model.tokenize("hello there, how are you")
    unedited = model.forward(ids)
    grid = RayGrid.start(str(tiny_vx), model, "1-2", options=SMALL)
    try:
        remote = grid.attach(model)
        assert np.array_equal(remote.forward(ids), unedited)
        hidden = model.config.hidden
        rng = np.random.default_rng(0)
        view.overlay.set(1, 5, FeatureOverride(gate=rng.standard_normal(hidden).astype(np.float32),
                                               down=rng.standard_normal(hidden).astype(np.float32) * 4))
        view.overlay.delete(2, 7)
        edited = model.forward(ids)
        assert not np.array_equal(edited, unedited)
        assert np.array_equal(remote.forward(ids), edited)
        view.overlay.add_weight(2, rng.standard_normal((hidden, 1)).astype(np.float32),
                                rng.standard_normal((96, 1)).astype(np.float32), np.zeros((96, 1), np.float32))
        assert np.array_equal(remote.forward(ids), model.forward(ids))  # a later edit travels too
        assert remote.generate(ids, max_new_tokens=4).ids == model.generate(ids, max_new_tokens=4).ids
        view.overlay.clear()
        assert np.array_equal(remote.forward(ids), unedited)
    finally:
        grid.close()


def test_layouts_the_model_does_not_have_are_refused(tiny_vx: Path) -> None:
    model = larql.load(tiny_vx)
    for layers, experts, message in (("1-9", None, "layers 1-9: the model has layers 0-3"),
                                     ("1-2,2-3", None, "layers 1-2 and layers 2-3 overlap"),
                                     ("x", None, "--ray-shards: 'x' is not a layer range"),
                                     (None, "0-1", "not a mixture of experts"),
                                     (None, None, "Ray shards need --ray-shards")):
        with pytest.raises(ServeError, match=message):
            RayGrid.start(str(tiny_vx), model, layers, experts, options=SMALL)
    grid = RayGrid.start(str(tiny_vx), model, "3-3", options=SMALL)
    try:
        with pytest.raises(RemoteError, match="not a model shaped like gemma3-270m"):
            grid.attach(larql.load("gemma3-270m"))
        with pytest.raises(RemoteError, match="refused layer 2: this shard computes the FFN of layers 3-3"):
            grid.groups[0].call("layer 2", "ffn", 2, np.zeros((1, model.config.hidden), np.float32))
    finally:
        grid.close()


def test_float16_on_the_wire_is_close() -> None:
    local = larql.load(MIXTRAL)
    ids = [int(i) for i in np.load(MIXTRAL.parent / "mixtral.npz")["p1.ids"]]
    grid = RayGrid.start(str(MIXTRAL), local, "0-1", options=SMALL.__class__(**{**SMALL.__dict__, "float16": True}))
    try:
        got, want = grid.attach(local).forward(ids), local.forward(ids)
        assert np.allclose(got, want, atol=2e-2) and not np.array_equal(got, want)
    finally:
        grid.close()


def test_without_ray_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` then fails as if it were not installed
    with pytest.raises(ServeError, match=r"^Ray is not installed: pip install 'larql\[ray\]'$"):
        import_ray()


def test_command_line_run_on_ray_shards() -> None:
    """`larql run gemma3-270m PROMPT --ray local --ray-shards 4-7,8-11 --json`, as a user runs it."""
    ref = golden("gemma3-270m", "hf")[0]
    r = run_larql("run", "gemma3-270m", ref["prompt"], "--max-tokens", "6", "--json", "--ray", "local",
                  "--ray-shards", "4-7,8-11")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ids"] == ref["greedy24_ids"][:6]
    for args, message in ((["--ray", "local", "--ray-shards", "4-40"], "layers 4-40: the model has layers 0-17"),
                          (["--ray-shards", "4-7"], "--ray-shards goes with --ray local|ADDRESS"),
                          (["--ray", "local"], "--ray needs --ray-shards"),
                          (["--ray", "127.0.0.1:1", "--ray-shards", "4-7"], "cannot reach the Ray cluster at 127.0.0.1:1")):
        r = run_larql("run", "gemma3-270m", "hi", "--max-tokens", "1", *args)
        assert r.returncode == 1 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
