"""A Hugging Face Hub cache written by hand, as `huggingface_hub` lays one out, so that Hub ids
resolve offline (HF_HUB_OFFLINE=1) through the library's real cache lookup:

    HF_HOME/hub/models--ORG--NAME/blobs/<sha256>             the files' bytes
    HF_HOME/hub/models--ORG--NAME/snapshots/<commit>/<file>   symbolic links to the blobs
    HF_HOME/hub/models--ORG--NAME/refs/main                   the commit main points at
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path


def commit_of(repo: str) -> str:
    """A stable fake commit hash per repository (40 hex digits, as the cache expects)."""
    return hashlib.sha1(repo.encode()).hexdigest()


def add_repo(hf_home: Path, repo: str, files: dict[str, Path]) -> Path:
    """Put `files` (name in the repo -> a local file) into the cache as `repo`'s main; returns the
    snapshot directory."""
    root = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
    commit = commit_of(repo)
    snapshot = root / "snapshots" / commit
    for name, src in files.items():
        data = src.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            shutil.copyfile(src, blob)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(blob)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    return snapshot


def add_dir(hf_home: Path, repo: str, directory: Path) -> Path:
    """Every file under `directory` as the repository `repo`."""
    files = {str(p.relative_to(directory)): p for p in sorted(directory.rglob("*")) if p.is_file()}
    return add_repo(hf_home, repo, files)
