"""Hugging Face Hub ids resolved through `huggingface_hub` from a Hub cache seeded by hand, offline
(HF_HUB_OFFLINE): the library's own cache lookup, as on a machine that downloaded them before.
Downloading itself (the network part) is not tested here: these machines cannot reach the Hub."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gguf
import huggingface_hub.constants
import numpy as np
import pytest

import larql
from larql.errors import UnknownModelError
from larql.model.hub import parse
from larql.model.load import resolve
from tests.hubcache import add_dir, add_repo, commit_of
from tests.synthetic import TinySpec, hf_weights, write_gguf, write_hf_dir

SPEC = TinySpec("llama")
IDS = [5, 80, 81, 120]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hub-src")
    out = {"a": root / "a.gguf", "b": root / "b.gguf", "readme": root / "README.md"}
    write_gguf(out["a"], SPEC, hf_weights(SPEC, seed=1), gguf.GGMLQuantizationType.Q8_0)
    write_gguf(out["b"], SPEC, hf_weights(SPEC, seed=2), gguf.GGMLQuantizationType.Q8_0)
    out["readme"].write_text("# a model card\n")
    out["hf"] = write_hf_dir(root / "hf", SPEC, hf_weights(SPEC, seed=3))
    return out


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory, files: dict[str, Path]) -> Path:
    home = tmp_path_factory.mktemp("hf-home")
    add_repo(home, "tiny-org/tiny-GGUF", {"tiny.Q8_0.gguf": files["a"], "README.md": files["readme"]})
    add_repo(home, "tiny-org/two-ggufs", {"a.gguf": files["a"], "q/b.gguf": files["b"]})
    add_dir(home, "tiny-org/tiny-hf", files["hf"])
    add_repo(home, "tiny-org/empty", {"README.md": files["readme"]})
    return home


@pytest.fixture
def offline(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """HF_HOME at the seeded cache and HF_HUB_OFFLINE on, in the environment and in the constants
    `huggingface_hub` read from it when it was imported."""
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    yield hf_home


@pytest.mark.parametrize("text, parsed", [
    ("google/gemma-3-270m", ("google/gemma-3-270m", None, None)),
    ("org/name@v1.0", ("org/name", "v1.0", None)),
    ("hf://google/gemma-3-270m", ("google/gemma-3-270m", None, None)),
    ("hf://org/name@main/sub/f.gguf", ("org/name", "main", "sub/f.gguf")),
    ("hf://org/name/f.gguf", ("org/name", None, "f.gguf")),
    ("out/g.vindex", None),  # a local name that is missing, not a repository
    ("models/tiny.gguf", None),
    ("./org/name", None),
    ("a/b/c", None),  # a file of a repository only in the hf:// form
    ("gemma3-270m", None),
])
def test_what_is_a_hub_id(text: str, parsed: tuple[str, str | None, str | None] | None) -> None:
    assert parse(text) == parsed


def test_a_gguf_repository_loads_from_the_cache(offline: Path, files: dict[str, Path]) -> None:
    want = larql.load(files["a"]).forward(IDS)
    for src in ("tiny-org/tiny-GGUF", "hf://tiny-org/tiny-GGUF", f"hf://tiny-org/tiny-GGUF@{commit_of('tiny-org/tiny-GGUF')}",
                "hf://tiny-org/tiny-GGUF/tiny.Q8_0.gguf"):
        m = larql.load(src)
        assert m.name == src.removeprefix("hf://") and np.array_equal(m.forward(IDS), want), src
        assert str(m.source).startswith(str(offline / "hub" / "models--tiny-org--tiny-GGUF" / "snapshots"))


def test_an_hf_directory_repository_and_a_named_gguf(offline: Path, files: dict[str, Path]) -> None:
    name, path = resolve("tiny-org/tiny-hf")
    assert (name, path.name) == ("tiny-org/tiny-hf", commit_of("tiny-org/tiny-hf")) and (path / "config.json").is_file()
    np.testing.assert_array_equal(larql.load("tiny-org/tiny-hf").forward(IDS), larql.load(files["hf"]).forward(IDS))
    b = larql.load("hf://tiny-org/two-ggufs/q/b.gguf")
    np.testing.assert_array_equal(b.forward(IDS), larql.load(files["b"]).forward(IDS))


def test_a_local_path_wins(offline: Path, files: dict[str, Path], tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tiny-org").mkdir()
    (tmp_path / "tiny-org" / "tiny-GGUF").symlink_to(files["b"])
    monkeypatch.chdir(tmp_path)
    name, path = resolve("tiny-org/tiny-GGUF")
    assert (name, path) == ("tiny-GGUF", Path("tiny-org/tiny-GGUF"))


@pytest.mark.parametrize("src, message", [
    ("tiny-org/missing", "tiny-org/missing: no such path here, and tiny-org/missing is not in the Hugging Face "
                         "cache ({cache}) while HF_HUB_OFFLINE is set"),
    ("hf://tiny-org/tiny-GGUF@v9", "hf://tiny-org/tiny-GGUF@v9: no such path here, and tiny-org/tiny-GGUF@v9 is not "
                                   "in the Hugging Face cache ({cache}) while HF_HUB_OFFLINE is set"),
    ("hf://tiny-org/tiny-GGUF/other.gguf", "hf://tiny-org/tiny-GGUF/other.gguf: no such path here, and "
                                           "tiny-org/tiny-GGUF (file other.gguf) is not in the Hugging Face cache"),
    ("tiny-org/two-ggufs", "tiny-org/two-ggufs: the repository holds several GGUF files (a.gguf, q/b.gguf); name "
                           "one, e.g. hf://tiny-org/two-ggufs/a.gguf"),
    ("tiny-org/empty", "tiny-org/empty: the Hub repository holds no vindex (index.json), HF model (config.json) or "
                       "GGUF file"),
])
def test_what_cannot_be_had_is_one_line(offline: Path, src: str, message: str) -> None:
    with pytest.raises(UnknownModelError) as e:
        larql.load(src)
    text = str(e.value)
    assert "\n" not in text and text.startswith(message.format(cache=offline / "hub")), text
