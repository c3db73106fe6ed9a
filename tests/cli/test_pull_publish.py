"""`larql pull` and `larql publish` offline: pull from a Hugging Face cache seeded by hand
(tests/hubcache.py) with HF_HUB_OFFLINE=1, through `huggingface_hub`'s own cache lookup; publish's
plan by --dry-run (every file an add: the repository is not reached), and the comparison that
decides add / change / unchanged / delete on file entries in the shape the Hub's tree API answers,
once through `huggingface_hub`'s HTTP client from a loopback stand-in for that one endpoint
(HF_ENDPOINT). Downloading, the real Hub's answers and uploading are not tested here: these
machines cannot reach the Hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.repocard import metadata_load

import larql
from larql.vindex.integrity import file_sha256
from larql.vindex.sharing import LocalFile, compare, git_blob_id, model_card, remote_of
from tests.hubcache import add_dir, add_repo, commit_of

INFERENCE_FILES = ("weights.bin", "weights.json")


def larql_offline(home: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "larql", *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd)


@pytest.fixture(scope="module")
def full(tiny_gguf: Path) -> Path:
    """An inference-level vindex of the tiny GGUF."""
    from larql.vindex.extract import extract

    return extract(tiny_gguf, tiny_gguf.parent / "full.vindex", level="inference")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, full: Path, tiny_vindex: Path) -> Path:
    """HF_HOME holding tiny-org/full (the inference vindex), tiny-org/browse (a browse-level one),
    and tiny-org/partial: the inference vindex's repository of which only index.json and the browse
    files were ever downloaded (what a browse pull leaves in the cache)."""
    home = tmp_path_factory.mktemp("hf-home")
    add_dir(home, "tiny-org/full", full)
    add_dir(home, "tiny-org/browse", tiny_vindex)
    index = json.loads((full / "index.json").read_text())
    larqls = home.parent / "larql-index.json"  # the fields LARQL's index.json (version 2) starts with
    larqls.write_text(json.dumps({"version": 2, "model": "google/gemma-3-4b-it", "family": "gemma3", "num_layers": 34}))
    add_repo(home, "rust-org/gemma-vindex", {"index.json": larqls})
    add_repo(home, "tiny-org/tiny-GGUF", {"tiny.gguf": full.parent / "tiny.gguf"})
    bad = home.parent / "embeddings.bin"  # one byte changed: not what index.json's sha256 says
    data = bytearray((full / "embeddings.bin").read_bytes())
    data[100] ^= 1
    bad.write_bytes(bytes(data))
    add_repo(home, "tiny-org/damaged", {n: bad if n == "embeddings.bin" else full / n
                                        for n in ["index.json", *index["files"]]})
    from larql.vindex.slice import slice_vindex

    add_dir(home, "tiny-org/client", slice_vindex(full, home.parent / "client.vindex", preset="client"))
    add_repo(home, "tiny-org/partial", {n: full / n for n in ["index.json", *index["files"]]
                                         if n not in INFERENCE_FILES})
    return home


def files_of(vindex: Path) -> dict[str, Any]:
    return dict(json.loads((vindex / "index.json").read_text())["files"])


def test_pull_gives_the_cached_snapshot(home: Path, full: Path, tmp_path: Path) -> None:
    snapshot = home / "hub" / "models--tiny-org--full" / "snapshots" / commit_of("tiny-org/full")
    for repo in ("tiny-org/full", "hf://tiny-org/full", f"hf://tiny-org/full@{commit_of('tiny-org/full')}"):
        r = larql_offline(home, "pull", repo)
        assert r.returncode == 0 and r.stdout.strip() == str(snapshot), r.stderr
        assert f"pulled tiny-org/full@{commit_of('tiny-org/full')[:12]}" in r.stderr and "Hugging Face cache" in r.stderr
    r = larql_offline(home, "pull", "tiny-org/full", "--json")
    got = json.loads(r.stdout)
    assert got["how"] == "cache" and got["files"] == len(files_of(full)) + 1
    assert larql.open_vindex(snapshot).index == larql.open_vindex(full).index


def test_pull_to_a_directory_copies_it_atomically(home: Path, full: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine.vindex"
    r = larql_offline(home, "pull", "tiny-org/full", "-o", str(out))
    assert r.returncode == 0 and r.stdout.strip() == str(out), r.stderr
    assert not any(p.is_symlink() for p in out.iterdir()) and files_of(out) == files_of(full)
    assert larql.load(out).forward([5, 6, 7]).tolist() == larql.load(full).forward([5, 6, 7]).tolist()
    r = larql_offline(home, "pull", "tiny-org/full", "-o", str(out))
    assert r.returncode == 1 and "already exists; choose another path or pass --force" in r.stderr
    assert larql_offline(home, "pull", "tiny-org/full", "-o", str(out), "--force").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.vindex"]  # no temporaries left


def test_a_browse_slice_needs_only_its_files(home: Path, full: Path, tmp_path: Path) -> None:
    """tiny-org/partial's cache has no weights: the browse slice comes from the files it has."""
    out = tmp_path / "b.vindex"
    r = larql_offline(home, "pull", "tiny-org/partial", "--slice", "browse", "-o", str(out))
    assert r.returncode == 0 and r.stdout.strip() == str(out), r.stderr
    v = larql.open_vindex(out)
    assert not v.has_model_weights and v.index["parts"][:4] == ["tokenizer", "embeddings", "gates", "down_meta"]
    assert v.index["sliced_from"] == {"path": f"hf://tiny-org/partial@{commit_of('tiny-org/partial')}", "preset": "browse"}
    assert {n: e for n, e in files_of(full).items() if n not in INFERENCE_FILES} == files_of(out)
    r = larql_offline(home, "pull", "tiny-org/partial")  # the whole repository is not in the cache
    assert r.returncode == 1 and "lacks weights.bin and 1 more, which index.json lists; HF_HUB_OFFLINE is set" in r.stderr
    assert len(r.stderr.splitlines()) == 1


def test_a_client_slice_is_cut_like_larql_slice(home: Path, full: Path, tmp_path: Path) -> None:
    r = larql_offline(home, "pull", "tiny-org/full", "--slice", "client", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "full-client.vindex" and "the client slice, cut" in r.stderr
    local = larql.vindex.slice.slice_vindex(full, tmp_path / "local.vindex", preset="client")
    pulled = tmp_path / "full-client.vindex"
    assert files_of(pulled) == files_of(local) and larql.open_vindex(pulled).index["parts"][-1] == "attention"
    r = larql_offline(home, "pull", "tiny-org/full", "--slice", "inference")  # all of it: the snapshot itself
    assert r.returncode == 0 and "snapshots" in r.stdout


def test_a_published_slice_is_pulled_as_it_is(home: Path, tmp_path: Path) -> None:
    r = larql_offline(home, "pull", "tiny-org/client", "--slice", "client", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["how"] == "cache", r.stderr
    r = larql_offline(home, "pull", "tiny-org/client", "--slice", "browse", "--json", cwd=tmp_path)
    got = json.loads(r.stdout)
    assert got["how"] == "cut" and got["path"] == "client-browse.vindex" and got["files"] == 5  # index + the browse core
    assert larql.open_vindex(tmp_path / "client-browse.vindex").index["parts"] == ["tokenizer", "embeddings", "gates",
                                                                                  "down_meta", "clusters"]
    r = larql_offline(home, "pull", "tiny-org/client", "--slice", "server")
    assert r.returncode == 1 and "tiny-org/client: its vindex (browse level) has no ffn" in r.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["tiny-org/browse", "--slice", "client"], "tiny-org/browse: its vindex (browse level) has no attention, which "
                                               "--slice client needs"),
    (["hf://tiny-org/full/weights.bin"], "names a file (weights.bin); give the repository: hf://tiny-org/full"),
    (["hf://tiny-org/full@v1", "--revision", "v2"], "two revisions (@v1 and --revision v2); give one"),
    (["nobody/nothing"], "nobody/nothing: nobody/nothing (file index.json) is not in the Hugging Face cache"),
    (["not a repo"], "not a Hugging Face Hub repository id"),
    (["tiny-org/tiny-GGUF"], "tiny-org/tiny-GGUF: holds no vindex (no index.json), but a model; make a vindex of a "
                             "model with larql extract tiny-org/tiny-GGUF -o NAME.vindex"),
    (["tiny-org/damaged", "--slice", "browse"], "embeddings.bin: contents differ from the sha256 in index.json"),
    (["tiny-org/damaged"], "embeddings.bin: contents differ from the sha256 in index.json"),
    (["rust-org/gemma-vindex"], "rust-org/gemma-vindex: a LARQL vindex (index.json version 2), which larql does "
                                "not open as it is; convert it once into a larql vindex (browse level): larql convert "
                                "DIR OUT.vindex (download it first: huggingface-cli download rust-org/gemma-vindex "
                                "--local-dir DIR)"),
])
def test_pull_refuses_in_one_line(home: Path, tmp_path: Path, args: list[str], message: str) -> None:
    r = larql_offline(home, "pull", *args, cwd=tmp_path)
    assert r.returncode == 1 and message in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_publish_dry_run_offline_lists_every_file_as_an_add(home: Path, full: Path, tmp_path: Path) -> None:
    r = larql_offline(home, "publish", str(full), "me/tiny-vindex", "--dry-run")
    assert r.returncode == 0, r.stderr
    *lines, summary = r.stdout.splitlines()
    names = sorted([*files_of(full), "index.json", "README.md"])
    assert [line.split()[:2] for line in lines] == [["add", n] for n in names]
    assert summary.startswith(f"me/tiny-vindex: {len(names)} files to upload (") and ", 0 unchanged;" in summary
    assert "the repository was not checked (HF_HUB_OFFLINE is set), so every file counts as an add" in summary
    assert summary.endswith("--dry-run: nothing uploaded")
    r = larql_offline(home, "publish", str(full), "hf://me/tiny-vindex@dev", "--slice", "browse", "--dry-run", "--json")
    plan = json.loads(r.stdout)
    sliced = larql.vindex.slice.slice_vindex(full, tmp_path / "s.vindex", preset="browse")  # what publish cuts
    card = model_card(larql.open_vindex(sliced).index, "me/tiny-vindex")
    sizes = {**{n: e["size"] for n, e in files_of(tmp_path / "s.vindex").items()}, "README.md": len(card.encode())}
    sizes["index.json"] = (tmp_path / "s.vindex" / "index.json").stat().st_size
    assert {f["name"]: f["bytes"] for f in plan["files"]} == sizes
    assert plan["revision"] == "dev" and not plan["checked"] and plan["why_unchecked"] == "HF_HUB_OFFLINE is set"
    assert "weights.bin" not in {f["name"] for f in plan["files"]} and {f["action"] for f in plan["files"]} == {"add"}


def test_publish_without_the_hub_uploads_nothing(home: Path, full: Path, tmp_path: Path) -> None:
    r = larql_offline(home, "publish", str(full), "me/tiny-vindex")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.strip().endswith("me/tiny-vindex: cannot compare with the repository (HF_HUB_OFFLINE is set); "
                                     "nothing uploaded (larql publish --dry-run shows the plan)")
    r = larql_offline(home, "publish", str(tmp_path / "none.vindex"), "me/x", "--dry-run")
    assert r.returncode == 1 and "no such vindex directory" in r.stderr


def _tree(entries: list[dict[str, Any]]) -> list[RepoFile]:
    """RepoFile entries from JSON in the shape the Hub's tree API answers (huggingface_hub's own class)."""
    return [RepoFile(**e) for e in entries]


def test_compare_by_lfs_sha256_and_git_blob_id(full: Path, tmp_path: Path) -> None:
    index = json.loads((full / "index.json").read_text())
    local = {n: LocalFile(full / n, e["sha256"], e["size"]) for n, e in index["files"].items()}
    local["index.json"] = LocalFile(full / "index.json", file_sha256(full / "index.json"),
                                    (full / "index.json").stat().st_size)
    big, small = "gate_vectors.bin", "index.json"
    lfs = lambda n, sha: {"type": "file", "path": n, "size": local[n].size, "oid": "0" * 40,  # noqa: E731
                          "lfs": {"oid": sha, "size": local[n].size, "pointerSize": 134}}
    tree = _tree([
        lfs(big, local[big].sha256),  # the same contents
        lfs("embeddings.bin", "f" * 64),  # other contents
        {"type": "file", "path": small, "size": local[small].size, "oid": git_blob_id(full / small)},
        {"type": "file", "path": "tokenizer.json", "size": 3, "oid": "1" * 40},  # a small file, changed
        lfs("weights.bin", "e" * 64) | {"path": "feature_labels.jsonl"},  # a vindex file no longer there
        {"type": "file", "path": ".gitattributes", "size": 10, "oid": "2" * 40},  # not a vindex file: kept
    ])
    steps = {s.name: s.action for s in compare(local, remote_of(tree))}
    assert steps[big] == "unchanged" and steps[small] == "unchanged"
    assert steps["embeddings.bin"] == "change" and steps["tokenizer.json"] == "change"
    assert steps["feature_labels.jsonl"] == "delete" and ".gitattributes" not in steps
    assert steps["weights.bin"] == "add" and steps["down_meta.bin"] == "add"
    assert {s.action for s in compare(local, None)} == {"add"}


def test_git_blob_id_is_gits(tmp_path: Path) -> None:
    f = tmp_path / "x.txt"
    f.write_bytes(b"a vindex\x00\n" * 100)
    r = subprocess.run(["git", "hash-object", str(f)], capture_output=True, text=True, check=True)
    assert git_blob_id(f) == r.stdout.strip()


def test_the_model_card_says_library_larql(full: Path, tmp_path: Path) -> None:
    index = larql.open_vindex(full).index
    card = tmp_path / "README.md"
    card.write_text(model_card(index, "me/tiny-vindex"))
    meta = metadata_load(card)  # huggingface_hub's own reading of the front matter
    assert meta is not None and meta["library_name"] == "larql" and "vindex" in meta["tags"]
    assert meta["larql"]["model"] == index["model"] and meta["larql"]["extract_level"] == "inference"
    assert meta["larql"]["num_layers"] == index["num_layers"] and "base_model" not in meta  # a local file's name
    assert "runs the model" in card.read_text() and 'USE "hf://me/tiny-vindex"' in card.read_text()
    hub_model = model_card({**index, "model": "google/gemma-3-270m", "extract_level": "browse",
                            "has_model_weights": False, "parts": ["tokenizer"]}, "me/x")
    card.write_text(hub_model)
    meta = metadata_load(card)
    assert meta is not None and meta["base_model"] == "google/gemma-3-270m" and meta["larql"]["parts"] == ["tokenizer"]


@pytest.fixture(scope="module")
def tree_endpoint(full: Path) -> Iterator[str]:
    """A loopback stand-in for the Hub's tree listing (GET /api/models/ORG/NAME/tree/REV), answering for
    me/tiny-vindex what a repository holding an older upload of `full` would, and RepoNotFound (as
    the Hub says it) for any other repository."""
    index = json.loads((full / "index.json").read_text())

    def lfs(name: str, sha256: str) -> dict[str, Any]:
        size = index["files"][name]["size"]
        return {"type": "file", "path": name, "size": size, "oid": "0" * 40,
                "lfs": {"oid": sha256, "size": size, "pointerSize": 134}}

    tree = [
        {"type": "file", "path": "index.json", "size": (full / "index.json").stat().st_size,
         "oid": git_blob_id(full / "index.json")},
        lfs("gate_vectors.bin", index["files"]["gate_vectors.bin"]["sha256"]),
        lfs("embeddings.bin", "e" * 64),
        {"type": "file", "path": "feature_labels.jsonl", "size": 12, "oid": "1" * 40},
        {"type": "directory", "path": "notes", "oid": "2" * 40},
        {"type": "file", "path": "notes/a.txt", "size": 5, "oid": "3" * 40},
    ]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ours = self.path.split("?")[0] == "/api/models/me/tiny-vindex/tree/main"
            body = json.dumps(tree if ours else {"error": "Repository not found"}).encode()
            self.send_response(200 if ours else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if not ours:
                self.send_header("X-Error-Code", "RepoNotFound")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_publish_dry_run_compares_with_the_listing(tree_endpoint: str, full: Path, home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(home), HF_ENDPOINT=tree_endpoint)

    def publish(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "larql", "publish", *args], capture_output=True, text=True,
                              timeout=600, env=env)

    r = publish(str(full), "me/tiny-vindex", "--dry-run")
    assert r.returncode == 0, r.stderr
    *lines, summary = r.stdout.splitlines()
    actions = {line.split()[1]: line.split()[0] for line in lines}
    assert actions.pop("index.json") == "unchanged" and actions.pop("gate_vectors.bin") == "unchanged"
    assert actions.pop("embeddings.bin") == "change" and actions.pop("feature_labels.jsonl") == "delete"
    assert set(actions.values()) == {"add"} and "README.md" in actions and "weights.bin" in actions
    assert summary.startswith(f"me/tiny-vindex: {len(actions) + 1} files to upload (")
    assert summary.endswith(", 2 unchanged, 1 to delete; --dry-run: nothing uploaded") and "not checked" not in summary
    r = publish(str(full), "me/new-vindex", "--dry-run", "--private")
    assert r.returncode == 0 and r.stdout.splitlines()[-1].endswith("; a new repository (private); --dry-run: "
                                                                    "nothing uploaded"), r.stderr
