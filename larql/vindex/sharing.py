"""Vindexes shared through the Hugging Face Hub, with `huggingface_hub`: `larql pull` and
`larql publish`.

pull     a vindex repository (all of it, or only the files a slice preset needs) into the standard
         Hugging Face cache, so HF_HOME, HF_HUB_OFFLINE and the token work as for any HF library;
         a slice the repository does not hold as it is gets cut locally into a new vindex.
publish  a vindex (or a slice of it) and a model card (README.md, `library_name: larql`) to a Hub
         repository, uploading only the files whose contents the repository does not have yet:
         an LFS file compared by its sha256, a small one by its git blob id.

The network parts (downloading, listing a repository's files, uploading) run only where the Hub
can be reached; the tests here use a Hub cache seeded by hand, offline, and `publish --dry-run`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from larql.errors import UnknownModelError, VindexError
from larql.io.jsonfile import read_json
from larql.io.tempfiles import clean_stale, swap_dir, temp_path
from larql.model.hub import PREFIX, hub_errors, is_hub_id, parse
from larql.vindex import layout
from larql.vindex.check import MAX_INDEX_BYTES, MAX_JSON_DEPTH, is_larql_index, larql_refusal, validate_index
from larql.vindex.slice import FILE_PARTS, PRESETS, PULL_SLICES, file_parts, slice_files

CARD_FILE = "README.md"
# the names a vindex's files can have: a remote file of these that the published vindex lacks is deleted
VINDEX_FILES = frozenset({layout.INDEX_FILE, *layout.BROWSE_FILES, *layout.INFERENCE_FILES,
                          *(n for names in FILE_PARTS.values() for n in names)})


def repo_ref(text: str, revision: str | None = None) -> tuple[str, str | None]:
    """(repository id, revision) of `org/name` or `hf://org/name[@rev]` (and --revision)."""
    parsed = parse(text) or (None if text.startswith(PREFIX) else parse(PREFIX + text))
    if parsed is None:
        raise UnknownModelError(f"{text}: not a Hugging Face Hub repository id (org/name or hf://org/name[@revision])")
    repo, rev, file = parsed
    if file is not None:
        raise UnknownModelError(f"{text}: names a file ({file}); give the repository: hf://{repo}")
    if rev is not None and revision is not None and rev != revision:
        raise UnknownModelError(f"{text}: two revisions (@{rev} and --revision {revision}); give one")
    return repo, rev or revision


def held_parts(index: Mapping[str, Any]) -> tuple[str, ...]:
    """The slice parts a vindex holds: a slice's `parts`, else its files and (with model weights)
    both tensor groups."""
    if "parts" in index:
        return tuple(index["parts"])
    files = index["files"]
    held = [p for p, names in FILE_PARTS.items() if any(n in files for n in names)]
    return (*held, "attention", "ffn") if index["has_model_weights"] else tuple(held)


@dataclass(frozen=True)
class Pulled:
    path: Path  # the vindex
    repo: str
    commit: str  # the snapshot's commit
    files: int  # files downloaded (or found in the cache)
    size: int  # their bytes
    how: str  # "cache", "copied" or "cut": the snapshot itself, a copy of it, a slice made from it


def pull(text: str, preset: str | None = None, revision: str | None = None, out: str | Path | None = None,
         overwrite: bool = False) -> Pulled:
    """Download the vindex repository `text` (or what the slice `preset` needs) into the Hugging
    Face cache; the vindex is the snapshot itself, or `out` (a copy of the snapshot, or the cut
    slice; a cut slice without `out` goes to ./NAME-PRESET.vindex). Opened once to verify it.

    Example:
        >>> pull("hf://org/gemma-3-270m-vindex", preset="browse", out="g.vindex")
    """
    import huggingface_hub as hf

    from larql.vindex.slice import slice_vindex
    from larql.vindex.store import open_vindex

    repo, rev = repo_ref(text, revision)
    if preset is not None and preset not in PULL_SLICES:
        raise VindexError(f"--slice {preset!r}: choose one of {', '.join(PULL_SLICES)}")
    index_path = index_json(text, repo, rev)
    commit = index_path.parent.name  # the snapshot's: every file comes from that one commit
    index = read_json(index_path, MAX_INDEX_BYTES, MAX_JSON_DEPTH, "vindex index")
    if not isinstance(index, dict) or (index.get("format"), index.get("version")) != (layout.FORMAT_NAME,
                                                                                      layout.FORMAT_VERSION):
        if is_larql_index(index):  # LARQL's own: converted, never pulled as it is
            raise VindexError(larql_refusal(text, "DIR") + f" (download it first: huggingface-cli download {repo} "
                              f"--local-dir DIR)")
        got = (index.get("format"), index.get("version")) if isinstance(index, dict) else (None, None)
        raise VindexError(f"{text}: holds no larql vindex: its index.json has format {got[0]!r}, version {got[1]!r}, "
                          f"not {layout.FORMAT_NAME!r} version {layout.FORMAT_VERSION}")
    validate_index(index, text)
    parts = None if preset in (None, "all") else PRESETS[preset]
    held = held_parts(index)
    if parts is not None:
        lacking = [p for p in parts if p not in held and p != "clusters"]  # clusters are optional anywhere
        if lacking:
            raise VindexError(f"{text}: its vindex ({index['extract_level']} level) has no {', '.join(lacking)}, "
                              f"which --slice {preset} needs; pull --slice browse, or publish a vindex extracted "
                              f"with --level inference")
    whole = parts is None or set(held) <= set(parts)
    by_files = not whole and parts is not None and file_parts(parts)
    wanted = [n for n in index["files"] if not by_files or any(n in FILE_PARTS[p] for p in parts or ())]
    names = [layout.INDEX_FILE, *sorted(wanted)]
    with hub_errors(text, repo, rev, path_too=False):
        snap = Path(hf.snapshot_download(repo, revision=commit, allow_patterns=names))
    missing = [n for n in names if not (snap / n).is_file()]
    if missing:
        from huggingface_hub import constants

        why = ("HF_HUB_OFFLINE is set; pull again where the Hub can be reached" if constants.is_offline_mode()
               else "the repository lacks it, or the Hub could not be reached")
        raise VindexError(f"{text}: the Hugging Face cache's snapshot {snap} lacks {missing[0]}"
                          f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}, which index.json "
                          f"lists; {why}")
    size = sum((snap / n).stat().st_size for n in names)
    source = f"{PREFIX}{repo}@{snap.name}"
    if whole:
        if out is None:
            open_vindex(snap)
            return Pulled(snap, repo, snap.name, len(names), size, "cache")
        path = copy_vindex(snap, Path(out), names, overwrite)
        open_vindex(path)
        return Pulled(path, repo, snap.name, len(names), size, "copied")
    assert preset is not None and parts is not None
    target = Path(out) if out is not None else Path(f"{repo.split('/')[1]}-{preset}.vindex")
    if by_files:
        path = slice_files(snap, index, target, parts, preset, source, overwrite=overwrite)
    else:  # the tensors are cut out of weights.bin, which came whole
        path = slice_vindex(snap, target, preset=preset, overwrite=overwrite, source=source)
    open_vindex(path)
    return Pulled(path, repo, snap.name, len(names), size, "cut")


def index_json(text: str, repo: str, rev: str | None) -> Path:
    """The repository's index.json, in the Hugging Face cache's snapshot of `rev`. A repository
    without one (a model's) is refused by name: a model is extracted, not pulled."""
    import huggingface_hub as hf
    from huggingface_hub import errors

    absent: Exception | None = None
    with hub_errors(text, repo, rev, layout.INDEX_FILE, path_too=False):  # a missing repository, no token, ...
        try:
            return Path(hf.hf_hub_download(repo, layout.INDEX_FILE, revision=rev))
        except errors.EntryNotFoundError as e:  # ... but not a missing file: that is said below
            absent = e
    assert absent is not None
    snap = None
    if isinstance(absent, errors.LocalEntryNotFoundError):  # not cached; is the rest of the repository?
        try:
            snap = Path(hf.snapshot_download(repo, revision=rev, local_files_only=True))
        except Exception:
            snap = None
        if snap is None or not any(snap.iterdir()):
            with hub_errors(text, repo, rev, layout.INDEX_FILE, path_too=False):
                raise absent
    model = snap is not None and ((snap / "config.json").is_file() or any(snap.rglob("*.gguf")))
    raise VindexError(f"{text}: holds no vindex (no {layout.INDEX_FILE}){', but a model' if model else ''}; make a "
                      f"vindex of a model with larql extract {text} -o NAME.vindex")


def copy_vindex(src: Path, out: Path, names: list[str], overwrite: bool) -> Path:
    """`names` of `src` into the new directory `out`, hard-linked where the file system allows
    (a vindex's files are never written again), written beside it and renamed into place."""
    clean_stale(out)
    if out.exists() and not overwrite:
        raise VindexError(f"{out}: already exists; choose another path or pass --force")
    tmp = temp_path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name in names:
            real = (src / name).resolve()  # the cache's snapshot holds symbolic links to its blobs
            try:
                os.link(real, tmp / name)
            except OSError:
                shutil.copyfile(real, tmp / name)
        swap_dir(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise VindexError(f"{out}: cannot write the pulled vindex ({e})") from None
    return out


# -- publish ----------------------------------------------------------------------------------


def model_card(index: Mapping[str, Any], repo: str) -> str:
    """README.md for the repository: YAML front matter (library_name: larql, the model, the extract
    level, the layer count) and a few lines on how to use it. Strings are JSON, which YAML reads."""
    model, level, layers = index["model"], index["extract_level"], index["num_layers"]
    parts = index.get("parts")
    meta = ["library_name: larql", "tags:", "- larql", "- vindex"]
    if is_hub_id(model):
        meta.append(f"base_model: {json.dumps(model)}")
    meta += ["larql:", f"  model: {json.dumps(model)}", f"  extract_level: {level}", f"  num_layers: {layers}",
             f"  hidden_size: {index['hidden_size']}", f"  dtype: {index['dtype']}", f"  quant: {index['quant']}"]
    if parts:
        meta.append(f"  parts: {json.dumps(list(parts))}")
    what = f"{level} level" + (f", a slice holding {', '.join(parts)}" if parts else "")
    runs = ("It runs the model (INFER, TRACE, generation)." if index["has_model_weights"]
            else "It browses (DESCRIBE, WALK, SELECT); it does not run the model.")
    return "\n".join([
        "---", *meta, "---", "", f"# {repo.split('/')[-1]}", "",
        f"A larql vindex of `{model}` ({what}): {layers} layers, hidden size {index['hidden_size']}, "
        f"{index['intermediate_size']} features per layer, {index['dtype']}. {runs}", "",
        "```bash", f"larql pull {repo}", f"larql lql 'USE \"hf://{repo}\"; STATS;'", "```", "",
    ])


def git_blob_id(path: Path) -> str:
    """The git object id of a file's contents (what the Hub gives for a file not stored by LFS)."""
    h = hashlib.sha1()
    h.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class LocalFile:
    path: Path
    sha256: str
    size: int


@dataclass(frozen=True)
class RemoteFile:
    size: int
    blob_id: str  # git object id
    sha256: str | None  # an LFS file's


@dataclass(frozen=True)
class Step:
    name: str
    action: str  # add, change, unchanged, delete
    size: int  # bytes uploaded (add, change), kept (unchanged) or removed (delete)


@dataclass(frozen=True)
class Plan:
    repo: str
    revision: str | None
    steps: list[Step]
    checked: bool  # the repository's files were listed (else every file is an add)
    why_unchecked: str  # when not checked: why
    exists: bool  # the repository exists (when checked)

    @property
    def uploads(self) -> list[Step]:
        return [s for s in self.steps if s.action in ("add", "change")]


def remote_of(entries: list[Any]) -> dict[str, RemoteFile]:
    """The files of a `list_repo_tree` answer (huggingface_hub RepoFile entries; folders skipped)."""
    out = {}
    for e in entries:
        if hasattr(e, "blob_id"):
            lfs = getattr(e, "lfs", None)
            out[e.path] = RemoteFile(int(e.size), e.blob_id, lfs.sha256 if lfs is not None else None)
    return out


def compare(local: Mapping[str, LocalFile], remote: Mapping[str, RemoteFile] | None) -> list[Step]:
    """Each local file: add (the repository lacks it, or was not checked), change (other contents)
    or unchanged; then each vindex file the repository has that the local vindex does not: delete."""
    steps = []
    for name in sorted(local):
        mine, theirs = local[name], (remote or {}).get(name)
        if theirs is None:
            action = "add"
        elif theirs.sha256 is not None:
            action = "unchanged" if theirs.sha256 == mine.sha256 else "change"
        else:
            action = "unchanged" if theirs.size == mine.size and theirs.blob_id == git_blob_id(mine.path) else "change"
        steps.append(Step(name, action, mine.size))
    for name in sorted(set(remote or {}) - set(local)):
        if name in VINDEX_FILES:
            steps.append(Step(name, "delete", (remote or {})[name].size))
    return steps


@contextmanager
def staged(vindex: str | Path, repo: str, preset: str | None = None) -> Iterator[dict[str, LocalFile]]:
    """The files to publish: the vindex's (verified by opening it) or those of its slice `preset`
    (cut into a temporary directory), and the model card; the temporary files go on exit."""
    from larql.vindex.integrity import file_sha256
    from larql.vindex.slice import slice_vindex
    from larql.vindex.store import open_vindex

    with tempfile.TemporaryDirectory(prefix="larql-publish-") as tmp:
        v = open_vindex(vindex)
        if preset is not None:
            v = open_vindex(slice_vindex(v.path, Path(tmp) / "slice.vindex", preset=preset))
        files = {name: LocalFile(v.path / name, entry["sha256"], entry["size"]) for name, entry in v.index["files"].items()}
        files[layout.INDEX_FILE] = LocalFile(v.path / layout.INDEX_FILE, file_sha256(v.path / layout.INDEX_FILE),
                                             (v.path / layout.INDEX_FILE).stat().st_size)
        card = Path(tmp) / CARD_FILE
        card.write_text(model_card(v.index, repo))
        files[CARD_FILE] = LocalFile(card, file_sha256(card), card.stat().st_size)
        yield files


def plan_upload(local: Mapping[str, LocalFile], repo: str, revision: str | None = None) -> Plan:
    """What publishing `local` to `repo` would do, the repository's files listed through the Hub;
    without the Hub (HF_HUB_OFFLINE, no connection) every file is an add, and the plan says so."""
    from huggingface_hub import HfApi, constants, errors

    if constants.is_offline_mode():
        return Plan(repo, revision, compare(local, None), False, "HF_HUB_OFFLINE is set", False)
    try:
        entries = list(HfApi().list_repo_tree(repo, recursive=True, revision=revision))
    except errors.RepositoryNotFoundError:  # a new repository (or a private one without a token)
        return Plan(repo, revision, compare(local, {}), True, "", False)
    except errors.RevisionNotFoundError:
        raise UnknownModelError(f"{repo}: the Hub repository has no revision {revision!r}") from None
    except Exception as e:  # no connection, the Hub down: the plan is still worth showing
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        return Plan(repo, revision, compare(local, None), False, f"the Hub could not be reached: {reason}", False)
    return Plan(repo, revision, compare(local, remote_of(entries)), True, "", True)


def upload(plan: Plan, local: Mapping[str, LocalFile], private: bool = False, message: str | None = None) -> str | None:
    """Carry out `plan` in one commit (creating the repository, private if asked, when it does not
    exist); returns the commit's URL, or None when there was nothing to change."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    if not plan.checked:
        raise UnknownModelError(f"{plan.repo}: cannot compare with the repository ({plan.why_unchecked}); nothing "
                                f"uploaded (larql publish --dry-run shows the plan)")
    ops: list[CommitOperationAdd | CommitOperationDelete] = [
        CommitOperationAdd(path_in_repo=s.name, path_or_fileobj=str(local[s.name].path)) for s in plan.uploads]
    ops += [CommitOperationDelete(path_in_repo=s.name) for s in plan.steps if s.action == "delete"]
    if not ops:
        return None
    api = HfApi()
    with hub_errors(plan.repo, plan.repo, plan.revision, path_too=False):
        if not plan.exists:
            api.create_repo(plan.repo, private=private, exist_ok=True)
        info = api.create_commit(plan.repo, ops, commit_message=message or "larql publish", revision=plan.revision)
    return str(getattr(info, "commit_url", "") or plan.repo)
