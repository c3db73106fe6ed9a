"""Expert shards: `larql serve --ffn-only --experts E1-E2` computes a mixture of experts' expert range,
a client composes shards (`use_remote_ffn` once per shard, `larql run --ffn URL --ffn URL`); on
loopback the tiny random Mixtral is the local model bit for bit, even when the client's own experts
are zeros (so the experts were computed on the shards)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import larql
from larql.errors import ServeError
from larql.model.remote_ffn import use_remote_ffn
from larql.serve.config import ServeConfig
from larql.serve.server import ServerThread
from larql.serve.sessions import open_served
from tests.cli.conftest import larql as run_larql

REF = Path(__file__).resolve().parents[1] / "golden" / "architectures" / "mixtral"


@pytest.fixture(scope="module")
def shards() -> Iterator[tuple[str, str]]:
    """Experts 0-1 on one server and 2-3 on another (every layer)."""
    with ExitStack() as stack:
        yield tuple(stack.enter_context(ServerThread(open_served(REF), ServeConfig(ffn_experts=span)))
                    for span in ((0, 1), (2, 3)))  # type: ignore[misc]


@pytest.fixture(scope="module")
def hollow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference model with every expert's weights zeroed: only the shards can compute them."""
    d = tmp_path_factory.mktemp("hollow") / "mixtral"
    shutil.copytree(REF, d)
    t = load_file(str(REF / "model.safetensors"))
    save_file({k: np.zeros_like(v) if ".experts." in k else v for k, v in t.items()}, str(d / "model.safetensors"))
    return d


def ids() -> list[int]:
    return [int(i) for i in np.load(REF.parent / "mixtral.npz")["p1.ids"]]


def test_two_shards_compose_to_the_local_model_bit_for_bit(shards: tuple[str, str], hollow: Path) -> None:
    local = larql.load(REF)
    want = local.forward(ids())
    client = larql.load(hollow)
    assert not np.allclose(client.forward(ids()), want)  # without its experts the client is another model
    both = use_remote_ffn(use_remote_ffn(client, shards[0]), shards[1])
    assert np.array_equal(both.forward(ids()), want)
    assert both.generate(ids(), max_new_tokens=5).ids == local.generate(ids(), max_new_tokens=5).ids  # KV cache
    half = use_remote_ffn(local, shards[1])  # experts 2-3 remote, 0-1 local
    assert np.array_equal(half.forward(ids()), want)
    _, got = half.run_with_cache(ids(), ["blocks.1.mlp.hook_router", "blocks.1.hook_mlp_out"])
    _, ref = local.run_with_cache(ids(), ["blocks.1.mlp.hook_router", "blocks.1.hook_mlp_out"])
    assert all(np.array_equal(got[k], ref[k]) for k in ref)  # the router and its hooks run on the client


def test_a_shard_of_some_layers(hollow: Path) -> None:
    local = larql.load(REF)
    with ServerThread(open_served(REF), ServeConfig(ffn_layers=(1, 1), ffn_experts=(0, 3))) as url:
        info = httpx.get(f"{url}/v1/info").json()
        assert (info["ffn_layers"], info["experts"], info["n_experts"]) == ([1, 1], [0, 3], 4)
        remote = use_remote_ffn(local, url)
        assert np.array_equal(remote.forward(ids()), local.forward(ids()))
        # layer 0's experts stay local: a hollow client is then right only in layer 1
        assert not np.array_equal(use_remote_ffn(larql.load(hollow), url).forward(ids()), local.forward(ids()))


def test_the_shard_refuses_what_it_does_not_serve(shards: tuple[str, str]) -> None:
    hidden = larql.load(REF).config.hidden
    rows = np.zeros((3, hidden), dtype="<f4").tobytes()

    def post(**params: object) -> httpx.Response:
        return httpx.post(f"{shards[0]}/v1/experts", params=params, content=rows)

    assert post(layer=0, experts="0,1", rows="1,2").status_code == 200
    for params, message in (({"layer": 0, "experts": "2", "rows": "3"}, "computes experts 0-1, not [2]"),
                            ({"layer": 0, "experts": "0,1", "rows": "1,1"}, "the body must be 2 x"),
                            ({"layer": 9, "experts": "0", "rows": "3"}, "not layer 9"),
                            ({"layer": 0, "experts": "0", "rows": "1,2"}, "the same length"),
                            ({"layer": 0, "experts": "x", "rows": "3"}, "comma-separated integers")):
        r = post(**params)
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    r = httpx.post(f"{shards[0]}/v1/ffn", params={"layer": 0}, content=rows)
    assert r.status_code == 400 and "experts 0-1 only" in r.json()["error"]["message"]
    with pytest.raises(ServeError, match="has experts 0..3"):
        ServerThread(open_served(REF), ServeConfig(ffn_experts=(2, 4)))


def test_command_line_shards_and_run(tmp_path: Path, infer_vx: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs, urls = [], []
    try:
        for span in ("0-1", "2-3"):
            procs.append(subprocess.Popen([sys.executable, "-m", "larql", "serve", str(REF), "--ffn-only", "--experts",
                                           span, "--port", "0"], stderr=subprocess.PIPE, text=True, env=env,
                                          cwd=tmp_path))
            line = procs[-1].stderr.readline()  # type: ignore[union-attr]
            m = re.search(rf"at (http://127\.0\.0\.1:\d+) \(experts {span} of all layers only\)", line)
            assert m, line
            urls.append(m.group(1))
        r = run_larql("run", str(REF), "hello", "--max-tokens", "4", "--json", "--ffn", urls[0], "--ffn", urls[1])
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["ids"] == larql.load(REF).generate("hello", max_new_tokens=4).ids
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=60)
    bad = run_larql("serve", str(infer_vx), "--ffn-only", "--experts", "0-1", "--port", "0")
    assert bad.returncode == 1 and "is not a mixture of experts" in bad.stderr.strip().splitlines()[-1], bad.stderr
    r = run_larql("serve", str(REF), "--experts", "0-1", "--port", "0")
    assert r.returncode == 1 and "--experts goes with --ffn-only" in r.stderr
