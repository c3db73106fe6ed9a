"""The scale-out seam: `larql serve --ffn-only --layers A-B` computes a layer range's FFN, a client
with `--ffn URL` (`use_remote_ffn`) computes everything else; on loopback, bit for bit the local model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

import larql
from larql.errors import ServeError, UnsupportedError
from larql.model.remote_ffn import use_remote_ffn
from larql.serve.config import ServeConfig
from larql.serve.server import ServerThread
from larql.serve.sessions import open_served
from tests.cli.conftest import larql as run_larql
from tests.conftest import golden


@pytest.fixture(scope="module")
def ffn_server(infer_vx: Path) -> Iterator[str]:
    with ServerThread(open_served(infer_vx), ServeConfig(ffn_layers=(1, 2))) as url:
        yield url


def test_remote_layers_are_the_local_model_bit_for_bit(ffn_server: str, infer_vx: Path) -> None:
    local = larql.load(infer_vx)
    remote = use_remote_ffn(local, ffn_server)
    ids = local.tokenize("hello there, how are you")
    assert np.array_equal(remote.forward(ids), local.forward(ids))
    names = [f"blocks.{i}.hook_mlp_out" for i in range(4)]
    _, got = remote.run_with_cache(ids, names)
    _, want = local.run_with_cache(ids, names)
    assert all(np.array_equal(got[n], want[n]) for n in names)
    assert remote.generate(ids, max_new_tokens=6).ids == local.generate(ids, max_new_tokens=6).ids  # through the KV cache
    with pytest.raises(UnsupportedError, match="layer 1's FFN runs on"):
        remote.forward(ids, hooks={"blocks.1.mlp.hook_post": lambda x, name: x})
    remote.forward(ids, hooks={"blocks.0.mlp.hook_post": lambda x, name: x})  # a local layer keeps its hooks


def test_an_edited_remote_layer_is_refused_not_served_unedited(ffn_server: str, infer_vx: Path) -> None:
    from larql.edit.patches.overlay import FeatureOverride

    view = larql.edit_vindex(infer_vx)
    model = view.model()  # its FFN reads the view's overlay: edits show at once
    remote = use_remote_ffn(model, ffn_server)
    ids = model.tokenize("hello there")
    view.overlay.delete(0, 3)  # a local layer: computed here, edited
    assert np.array_equal(remote.forward(ids), model.forward(ids))
    view.overlay.set(2, 5, FeatureOverride(down=np.ones(model.config.hidden, np.float32)))
    with pytest.raises(UnsupportedError, match=f"layer 2 is edited here and its FFN runs on {ffn_server}"):
        remote.forward(ids)


def test_gemma_with_eight_remote_layers_equals_local(monkeypatch: pytest.MonkeyPatch) -> None:
    import larql.quant.tensor as tensor
    from larql.model.load import resolve

    # Both models fresh, with room to repack: a matrix runs on its repacked int8 copy or on the GGUF
    # blocks by the process-wide repacking budget left when it is first used (logits 1.5e-5 apart), so
    # the session's model, used by earlier tests, may run other kernels than the server's new one.
    monkeypatch.setattr(tensor, "_repack_budget", [1 << 40])
    local = larql.load("gemma3-270m")
    with ServerThread(open_served(resolve("gemma3-270m")[1]), ServeConfig(ffn_layers=(4, 11))) as url:
        remote = use_remote_ffn(local, url)
        ids = local.tokenize("The capital of France is")
        assert np.array_equal(remote.forward(ids), local.forward(ids))


def test_the_ffn_server_refuses_what_it_does_not_serve(ffn_server: str, infer: str, infer_vx: Path) -> None:
    h = np.zeros((2, larql.load(infer_vx).config.hidden), dtype="<f4").tobytes()
    r = httpx.post(f"{ffn_server}/v1/ffn", params={"layer": 3}, content=h)
    assert r.status_code == 400 and "layers 1-2, not layer 3" in r.json()["error"]["message"]
    r = httpx.post(f"{ffn_server}/v1/ffn", params={"layer": 1}, content=h[:-4])
    assert r.status_code == 400 and "float32 values" in r.json()["error"]["message"]
    assert httpx.post(f"{ffn_server}/v1/lql", json={"query": "STATS"}).status_code == 404  # nothing else is served
    assert httpx.get(f"{ffn_server}/v1/info").json()["ffn_layers"] == [1, 2]
    with pytest.raises(ServeError, match="not an FFN server"):
        use_remote_ffn(larql.load(infer_vx), infer)
    with pytest.raises(ServeError, match="not a model shaped like gemma3-270m"):
        use_remote_ffn(larql.load("gemma3-270m"), ffn_server)


def test_command_line_serve_and_run(tmp_path: Path) -> None:
    """`larql serve gemma3-270m --ffn-only --layers 4-11` and `larql run ... --ffn URL`, as a user runs them."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "larql", "serve", "gemma3-270m", "--ffn-only", "--layers", "4-11",
                             "--port", "0"], stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        m = re.search(r"at (http://127\.0\.0\.1:\d+) \(the FFN of layers 4-11 only\)", line)
        assert m, line
        ref = golden("gemma3-270m", "hf")[0]
        r = run_larql("run", "gemma3-270m", ref["prompt"], "--max-tokens", "6", "--json", "--ffn", m.group(1))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["ids"] == ref["greedy24_ids"][:6]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    bad = run_larql("serve", "gemma3-270m", "--ffn-only", "--layers", "4-40", "--port", "0")
    assert bad.returncode == 1 and bad.stderr.strip().endswith("--layers 4-40: gemma3-270m has layers 0..17")
    for args, message in ((["--ffn-only"], "--ffn-only needs --layers A-B"),
                          (["--layers", "1-2"], "--layers goes with --ffn-only"),
                          (["--ffn-only", "--layers", "x"], "--layers: 'x' is not a layer range such as 4-7")):
        r = run_larql("serve", "gemma3-270m", *args, "--port", "0")
        assert r.returncode == 1 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
