"""Models and vindexes named by a Hugging Face Hub id, fetched with `huggingface_hub`.

    org/name                 a Hub repository (a path that exists here always wins)
    hf://org/name[@rev]      the same, at a branch, tag or commit
    hf://org/name[@rev]/f    one file of it (a GGUF of a repository that holds several)

A repository is downloaded into the standard Hugging Face cache, so `HF_HOME`, `HF_HUB_CACHE`,
`HF_HUB_OFFLINE` and the token (`HF_TOKEN`, `hf auth login`) work as for any HF library; offline, a
repository already in the cache is used as it is. What the snapshot holds decides what it is: a
vindex (index.json), an HF model directory (config.json), or its one GGUF file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from larql.errors import UnknownModelError

PREFIX = "hf://"
_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[\w])?"
_ID = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<rev>[\w./-]+?))?(?:/(?P<file>.+))?")
# a name ending like a local file is a path that is missing, not a Hub id
_LOCAL_SUFFIXES = (".gguf", ".vindex", ".safetensors", ".json", ".vlp", ".bin", ".lql")


def parse(text: str) -> tuple[str, str | None, str | None] | None:
    """(repo id, revision, file in the repo) of a Hub id, or None when `text` is not one. A file is
    named only in the `hf://` form; a bare `org/name` has exactly one slash. A revision ends at the
    first slash after `@` (a branch named with slashes is given by its commit hash instead)."""
    hf = text.startswith(PREFIX)
    body = text[len(PREFIX):] if hf else text
    m = _ID.fullmatch(body)
    if m is None or (not hf and (m["file"] or body.lower().endswith(_LOCAL_SUFFIXES))):
        return None
    return m["repo"], m["rev"], m["file"]


def is_hub_id(text: str) -> bool:
    return parse(text) is not None


def local_or_hub(src: str | Path) -> Path:
    """The path `src` names: itself when it exists or is not a Hub id, else the Hub repository's
    local snapshot (downloaded first when it is not in the cache)."""
    path = Path(src).expanduser()
    if isinstance(src, Path) or path.exists() or not is_hub_id(str(src)):
        return path
    return hub_path(str(src))


def hub_path(text: str) -> Path:
    """The local path of a Hub id: the named file, or the snapshot's vindex, model directory or
    GGUF file (raises UnknownModelError, one line, when it cannot be had)."""
    parsed = parse(text)
    if parsed is None:
        raise UnknownModelError(f"{text}: not a Hugging Face Hub id (org/name or hf://org/name[@revision])")
    repo, rev, file = parsed
    try:
        import huggingface_hub as hf
        from huggingface_hub import constants, errors
    except ImportError as e:
        raise UnknownModelError(f"{text}: Hub ids need huggingface_hub: pip install huggingface_hub") from e
    with hub_errors(text, repo, rev, file):
        if file is not None:
            return Path(hf.hf_hub_download(repo, file, revision=rev))
        if not constants.is_offline_mode():
            try:
                files: list[str] | None = hf.list_repo_files(repo, revision=rev)
            except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError):
                raise
            except Exception:  # no connection: snapshot_download falls back to the cache
                files = None
            if files is not None:
                _refuse_ambiguous(files, text)
        snapshot = Path(hf.snapshot_download(repo, revision=rev))
    return _pick(snapshot, text)


@contextmanager
def hub_errors(text: str, repo: str, rev: str | None, file: str | None = None, *, path_too: bool = True) -> Iterator[None]:
    """Turn what `huggingface_hub` raises while fetching `repo` (at `rev`, or its `file`) into one
    UnknownModelError line naming `text` and what to do (`path_too`: `text` could have been a local
    path, and the message says that there is none)."""
    from huggingface_hub import constants, errors

    at = f"{repo}@{rev}" if rev else repo
    nopath = "no such path here, and " if path_too else ""
    try:
        yield
    except errors.GatedRepoError:
        raise UnknownModelError(f"{text}: {at} is gated on the Hub; accept its terms there and log in "
                                f"(`hf auth login` or HF_TOKEN)") from None
    except errors.RepositoryNotFoundError:
        raise UnknownModelError(f"{text}: {nopath}no repository {repo} on the Hugging Face Hub "
                                f"(a private one needs a token: `hf auth login` or HF_TOKEN)") from None
    except errors.RevisionNotFoundError:
        raise UnknownModelError(f"{text}: the Hub repository {repo} has no revision {rev!r}") from None
    except errors.LocalEntryNotFoundError:  # before EntryNotFoundError, its base
        why = "HF_HUB_OFFLINE is set" if constants.is_offline_mode() else "the Hub cannot be reached"
        what = f"{at} (file {file})" if file else at
        raise UnknownModelError(f"{text}: {nopath}{what} is not in the Hugging Face cache "
                                f"({constants.HF_HUB_CACHE}) while {why}") from None
    except errors.EntryNotFoundError:
        raise UnknownModelError(f"{text}: the Hub repository {at} has no file {file!r}") from None
    except (errors.HfHubHTTPError, OSError, ValueError) as e:
        raise UnknownModelError(f"{text}: the Hugging Face Hub could not give {at}: "
                                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _refuse_ambiguous(files: list[str], text: str) -> None:
    """A repository of several GGUF files and no model directory: which one is for the user to say
    (downloading them all could be tens of gigabytes)."""
    ggufs = sorted(f for f in files if f.endswith(".gguf"))
    if "config.json" not in files and "index.json" not in files and len(ggufs) > 1:
        raise UnknownModelError(f"{text}: the repository holds {len(ggufs)} GGUF files; name one, e.g. "
                                f"hf://{text.removeprefix(PREFIX)}/{ggufs[0]}")


def _pick(snapshot: Path, text: str) -> Path:
    """What a snapshot is: a vindex or HF model directory (itself), or its one GGUF file."""
    if (snapshot / "index.json").is_file() or (snapshot / "config.json").is_file():
        return snapshot
    ggufs = sorted(snapshot.rglob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        names = ", ".join(str(g.relative_to(snapshot)) for g in ggufs[:4])
        raise UnknownModelError(f"{text}: the repository holds several GGUF files ({names}); name one, e.g. "
                                f"hf://{text.removeprefix(PREFIX)}/{ggufs[0].relative_to(snapshot)}")
    raise UnknownModelError(f"{text}: the Hub repository holds no vindex (index.json), HF model (config.json) "
                            f"or GGUF file")
