"""Hub ids where a model or vindex path is taken: `larql run` and `larql extract` (subprocesses with
HF_HOME and HF_HUB_OFFLINE=1 in their environment), LQL USE / USE MODEL / EXTRACT MODEL, and
`larql serve`'s model id, all from a Hugging Face cache seeded by hand (tests/hubcache.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gguf
import huggingface_hub.constants
import openai
import pytest

import larql
from larql.errors import LarqlError
from larql.lql.executor import execute
from larql.lql.session import Session
from larql.serve.server import ServerThread
from larql.serve.sessions import open_served
from larql.vindex.extract import extract
from tests.hubcache import add_dir, add_repo
from tests.synthetic import TinySpec, hf_weights, write_gguf

SPEC = TinySpec("llama")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(HF_HOME, the GGUF held as tiny-org/tiny-GGUF); tiny-org/tiny-vindex holds its vindex."""
    root = tmp_path_factory.mktemp("hub-cli")
    model = root / "src" / "tiny.gguf"
    model.parent.mkdir()
    write_gguf(model, SPEC, hf_weights(SPEC, seed=4), gguf.GGMLQuantizationType.Q8_0)
    home = root / "hf"
    add_repo(home, "tiny-org/tiny-GGUF", {"tiny.gguf": model})
    add_dir(home, "tiny-org/tiny-vindex", extract(model, root / "src" / "t.vindex"))
    return home, model


@pytest.fixture
def offline(hub: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = hub[0]
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    yield home


def larql_offline(home: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "larql", *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd)


def test_larql_run_and_extract_take_a_hub_id(hub: tuple[Path, Path], tmp_path: Path) -> None:
    home, model = hub
    want = larql.load(model).generate("abc", max_new_tokens=4)
    r = larql_offline(home, "run", "tiny-org/tiny-GGUF", "abc", "--max-tokens", "4", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ids"] == want.ids
    r = larql_offline(home, "run", "hf://tiny-org/tiny-GGUF/tiny.gguf", "abc", "--max-tokens", "4", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ids"] == want.ids, r.stderr
    r = larql_offline(home, "extract", "hf://tiny-org/tiny-GGUF", "-o", str(tmp_path / "x.vindex"), "--quiet")
    assert r.returncode == 0, r.stderr
    assert larql.open_vindex(tmp_path / "x.vindex").index["source"]["sha256"] == \
        larql.open_vindex(home / ".." / "src" / "t.vindex").index["source"]["sha256"]
    r = larql_offline(home, "run", "nobody/nothing", "abc")
    assert r.returncode != 0 and r.stderr.strip() == (
        f"larql: error: nobody/nothing: no such path here, and nobody/nothing is not in the Hugging Face cache "
        f"({home / 'hub'}) while HF_HUB_OFFLINE is set")


def test_lql_use_and_extract_take_a_hub_id(offline: Path, hub: tuple[Path, Path], tmp_path: Path) -> None:
    s = Session()
    execute('USE "hf://tiny-org/tiny-vindex"', s)
    assert s.vindex is not None and s.vindex.store.path.parent.name == "snapshots"
    execute('USE MODEL "tiny-org/tiny-GGUF"', s)
    assert s.model is not None and s.model.name == "tiny-org/tiny-GGUF"
    execute(f'EXTRACT MODEL "hf://tiny-org/tiny-GGUF" INTO "{tmp_path / "e.vindex"}"', s)
    assert (tmp_path / "e.vindex" / "index.json").is_file()
    with pytest.raises(LarqlError, match='hf://tiny-org/tiny-GGUF is a model, not a vindex: USE MODEL '
                                         '"hf://tiny-org/tiny-GGUF" runs it'):
        execute('USE "hf://tiny-org/tiny-GGUF"', Session())


def test_serve_names_the_model_by_its_hub_id(offline: Path) -> None:
    with ServerThread(open_served("tiny-org/tiny-GGUF")) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny-org/tiny-GGUF"]
        assert client.completions.create(model="tiny-org/tiny-GGUF", prompt="abc", max_tokens=2).model == \
            "tiny-org/tiny-GGUF"


def test_a_vindexfile_builds_from_a_hub_id(offline: Path, tmp_path: Path) -> None:
    from larql.vindexfile.run import build

    for n, src in enumerate(("hf://tiny-org/tiny-vindex", "tiny-org/tiny-GGUF")):
        d = tmp_path / f"proj{n}"
        d.mkdir()
        (d / "Vindexfile").write_text(f"FROM {src}\nDELETE layer = 1 AND feature = 7\n")
        out = build(d, tmp_path / f"out{n}.vindex")
        assert [r.step.name for r in out.runs] == ["FROM", "DELETE", "COMPILE"]
        assert (tmp_path / f"out{n}.vindex" / "index.json").is_file()
