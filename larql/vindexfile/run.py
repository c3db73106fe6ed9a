"""`larql build`: run a Vindexfile into a vindex, step by step, through a cache.

The steps, in order: FROM (a vindex is used in place; a model is extracted), one step per PATCH /
INSERT / DELETE (each leaves the patch of what it changed), COMPILE (the edits baked into a vindex,
when there are any), LABELS (all LABELS files, merged), EXPOSE (a slice, when it keeps less than
the whole). Each step's key is the sha256 of the previous key, the instruction and the content of
every file it reads, so an unchanged prefix of a Vindexfile is not redone: a step whose key is in
the cache (DIR/.larql-build by default) is taken from it. Every cache entry and the output are
written atomically (temporary name + rename), and the output only after every step succeeded, so a
failure leaves no output behind. The output's index.json records no wall-clock time and no cache
path: the same inputs give the same bytes.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from larql.edit.patches.patch import Patch, index_checksum, save_patch
from larql.edit.state.view import EditableVindex, edit_vindex
from larql.errors import BuildError, LarqlError, LqlError
from larql.io.pathguard import overlap
from larql.version import __version__
from larql.vindex import layout
from larql.vindex.check import validate_index
from larql.vindex.store import open_vindex
from larql.vindex.writer import VindexWriter
from larql.vindexfile.labels import write_labelled
from larql.vindexfile.parse import Instruction, Vindexfile, read_vindexfile

Progress = Callable[[str, int, int], None]
CACHE_DIR = ".larql-build"
DEFAULT_OUTPUT = "build.vindex"
EDITS = ("PATCH", "INSERT", "DELETE")


@dataclass(frozen=True)
class Step:
    name: str  # FROM, PATCH, INSERT, DELETE, COMPILE, LABELS, EXPOSE
    line: int  # the Vindexfile line (0: a step the build adds, COMPILE)
    text: str  # what it does, as shown
    key: str
    files: tuple[Path, ...] = ()  # the files it reads (FROM: the model or vindex; PATCH, LABELS)
    instruction: Instruction | None = None


@dataclass
class StepRun:
    step: Step
    cached: bool
    seconds: float


@dataclass
class BuildReport:
    output: Path
    runs: list[StepRun] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ran(self) -> list[StepRun]:
        """The steps that did work (not taken from the cache)."""
        return [r for r in self.runs if not r.cached]


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def file_hash(path: Path) -> str:
    """sha256 of a file's bytes, or of a directory's files (names and bytes, sorted)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path)).encode() if path.is_dir() else b"")
        with open(f, "rb") as fh:
            while block := fh.read(1 << 22):
                h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Source:
    """What FROM names: a vindex (used in place) or a model to extract, and its content hash."""

    path: Path
    is_vindex: bool
    digest: str
    level: str = "inference"  # the level a model is extracted at


@dataclass(frozen=True)
class Plan:
    source: Source
    steps: list[Step]
    expose: str | None  # the last EXPOSE's level, if any


def _source(root: Path, vf: Vindexfile, ins: Instruction) -> Source:
    from larql.model.hub import hub_path, is_hub_id
    from larql.model.load import ALIASES, resolve

    local = (root / ins.arg).expanduser()
    if not local.exists() and ins.arg not in ALIASES and is_hub_id(ins.arg):
        try:  # a Hugging Face Hub id: the repository's snapshot (a vindex or a model) in the HF cache
            local = hub_path(ins.arg)
        except LarqlError as e:
            raise BuildError(f"{vf.path.name}:{ins.line}: FROM {ins.arg}: {e}") from e
    if (local / layout.INDEX_FILE).is_file():  # a vindex: its sealed index.json names every file's sha256
        return Source(local, True, hashlib.sha256((local / layout.INDEX_FILE).read_bytes()).hexdigest())
    if ins.arg not in ALIASES and not local.exists():
        raise BuildError(f"{vf.path.name}:{ins.line}: FROM {ins.arg}: no vindex, model file or HF directory "
                         f"there (relative paths are from {root}), not an alias ({', '.join(ALIASES)}), "
                         f"and not a Hugging Face Hub id (org/name)")
    try:
        _, path = resolve(ins.arg if ins.arg in ALIASES else local)
    except LarqlError as e:
        raise BuildError(f"{vf.path.name}:{ins.line}: FROM {ins.arg}: {e}") from e
    return Source(path, False, file_hash(path))


def _input(root: Path, vf: Vindexfile, ins: Instruction) -> Path:
    path = root / ins.arg
    if not path.is_file():
        raise BuildError(f"{vf.path.name}:{ins.line}: {ins.keyword} {ins.arg}: no such file (relative paths are "
                         f"from {root})")
    return path


def plan(root: Path, vf: Vindexfile, chosen: tuple[Instruction, ...]) -> Plan:
    """The steps a build runs, with their cache keys: every input is found and hashed here,
    before any work, so a missing file fails the build at once."""
    first = chosen[0]
    src = _source(root, vf, first)
    expose = next((i.arg for i in reversed(chosen) if i.keyword == "EXPOSE"), None)
    # a model is extracted at the level the build needs: weights for INSERT, or for an output that keeps them
    level = expose or "inference"
    if level == "browse" and any(i.keyword == "INSERT" for i in chosen):
        level = "inference"
    src = Source(src.path, src.is_vindex, src.digest, level)
    key = _key("FROM", __version__, src.is_vindex, src.digest, None if src.is_vindex else level)
    steps = [Step("FROM", first.line, f"FROM {first.arg}" + ("" if src.is_vindex else f" (extract, {level})"),
                  key, (src.path,), first)]
    for ins in chosen:
        if ins.keyword in EDITS:
            files: tuple[Path, ...] = (_input(root, vf, ins),) if ins.keyword == "PATCH" else ()
            key = _key(key, ins.keyword, ins.arg, [file_hash(f) for f in files])
            steps.append(Step(ins.keyword, ins.line, ins.text, key, files, ins))
    if len(steps) > 1:
        key = _key(key, "COMPILE")
        steps.append(Step("COMPILE", 0, "COMPILE (bake the edits)", key))
    labels = [i for i in chosen if i.keyword == "LABELS"]
    if labels:
        files = tuple(_input(root, vf, i) for i in labels)
        key = _key(key, "LABELS", [file_hash(f) for f in files])
        steps.append(Step("LABELS", labels[0].line, "LABELS " + ", ".join(i.arg for i in labels), key, files))
    # inference and all keep every part a vindex can have, and a browse extraction is browse already
    if expose == "browse" and (src.is_vindex or level != "browse"):
        line = next(i.line for i in reversed(chosen) if i.keyword == "EXPOSE")
        key = _key(key, "EXPOSE", expose)
        steps.append(Step("EXPOSE", line, f"EXPOSE {expose}", key))
    return Plan(src, steps, expose)


class _State:
    """The build so far: the latest vindex, the patches since it, and (once an edit must run)
    an editable view with those patches applied."""

    def __init__(self, vindex: Path) -> None:
        self.vindex = vindex
        self.patches: list[Path] = []
        self._view: EditableVindex | None = None

    def view(self) -> EditableVindex:
        if self._view is None:
            self._view = edit_vindex(self.vindex)
            for p in self.patches:
                self._view.patches.apply(p)
        return self._view

    def reset(self, vindex: Path) -> None:
        """Move on to a new vindex that holds every edit so far."""
        self.vindex, self.patches, self._view = vindex, [], None

    def add_patch(self, path: Path) -> None:
        self.patches.append(path)
        if self._view is not None:
            self._view.patches.apply(path)


def _run_edit(step: Step, state: _State, out: Path) -> None:
    """Run one PATCH / INSERT / DELETE on the view and save what it changed as the patch `out`."""
    from larql.lql.executor import run_statement
    from larql.lql.session import Session

    v = state.view()
    ins = step.instruction
    assert ins is not None
    if step.name == "PATCH":
        ops = list(v.patches.apply(step.files[0]).ops)
        v.patches.applied.pop()
    else:
        assert ins.statement is not None
        run_statement(ins.statement, Session(vindex=v, source=ins.text))
        ops, v.patches.pending = list(v.patches.pending), []
    # no clock and no path in the cached patch: the step's key already says what made it
    save_patch(Patch(out.name, out, ops, v.index["model"], index_checksum(v.path)), out, overwrite=True,
               token_text=v.token_text)
    state.add_patch(out)  # replays the overlay with the saved patch in place of what the step recorded


def _step(step: Step, state: _State, entry: Path, src: Source, progress: Progress | None) -> None:
    """Do one step's work into the cache entry `entry` and move the state on."""
    if step.name == "FROM":
        from larql.vindex.extract import extract

        state.vindex = extract(src.path, entry, level=src.level, progress=progress)
    elif step.name in EDITS:
        _run_edit(step, state, entry)
    elif step.name == "COMPILE":
        from larql.edit.bake.compile import compile_vindex

        state.reset(compile_vindex(state.view(), entry).path)
    elif step.name == "LABELS":
        state.vindex = write_labelled(state.vindex, entry, step.files)
    else:  # EXPOSE browse
        from larql.vindex.slice import slice_vindex

        state.vindex = slice_vindex(state.vindex, entry, preset="browse")


def _fail_at(vf: Vindexfile, step: Step, e: LarqlError, cache_dir: Path) -> BuildError:
    msg = e.message if isinstance(e, LqlError) else str(e).splitlines()[0]
    # a cache entry's name means nothing to the user: say what it holds
    msg = re.sub(re.escape(str(cache_dir)) + r"/[0-9a-f]{40}\.vindex", "the vindex built so far", msg)
    where = f"{vf.path.name}:{step.line}" if step.line else str(vf.path.name)
    return BuildError(f"{where}: {step.text}: {msg}")


def build(directory: str | Path, output: str | Path | None = None, stage: str | None = None, force: bool = False,
          cache: str | Path | None = None, progress: Progress | None = None) -> BuildReport:
    """Build the Vindexfile in `directory` (up to `stage`) into the vindex `output`.

    Example:
        >>> build("recipes/geo", "geo.vindex").ran   # [] when every step was cached
    """
    t0 = time.perf_counter()
    root = Path(directory) if Path(directory).is_dir() else Path(directory).parent
    vf = read_vindexfile(directory)
    chosen = vf.select(stage)
    out = Path(output) if output is not None else root / DEFAULT_OUTPUT
    if out.exists() and not force:
        raise BuildError(f"{out}: already exists; choose another --output or pass --force")
    p = plan(root, vf, chosen)
    src, steps = p.source, p.steps
    cache_dir = Path(cache) if cache is not None else root / CACHE_DIR
    refused = (overlap(out, [(root, "the build directory (its Vindexfile)")], allow_inside=True)
               or overlap(out, [(cache_dir, "the build cache"), (src.path, "the FROM source")]))
    if refused is not None:
        raise BuildError(f"{refused}; choose another --output")
    cache_dir.mkdir(parents=True, exist_ok=True)
    report = BuildReport(out)
    state = _State(src.path)
    entries = [cache_dir / (s.key[:40] + (".vlp" if s.name in EDITS else ".vindex")) for s in steps]
    # the latest cached vindex holds every step before it: those need not even be replayed
    start = max((n for n, (s, e) in enumerate(zip(steps, entries, strict=True))
                 if s.name not in EDITS and e.exists()), default=0)
    for n, (step, entry) in enumerate(zip(steps, entries, strict=True)):
        s0 = time.perf_counter()
        hit = n < start or (step.name == "FROM" and src.is_vindex) or entry.exists()
        if n < start or (step.name == "FROM" and src.is_vindex):
            pass  # covered by the cached vindex at `start`; or a FROM vindex, used in place (never written)
        elif hit:
            if step.name in EDITS:
                state.add_patch(entry)
            else:
                state.reset(entry)
        else:
            try:
                _step(step, state, entry, src, progress)
            except LarqlError as e:
                raise _fail_at(vf, step, e, cache_dir) from e
        report.runs.append(StepRun(step, hit, time.perf_counter() - s0))
    _write_output(state.vindex, out, force, vf, stage, p)
    report.seconds = time.perf_counter() - t0
    return report


def _stamp(src: Source) -> str:
    """The one time a build records, derived from its inputs (SOURCE_DATE_EPOCH if set, as
    reproducible builds do; else the FROM vindex's extraction time, or the model file's mtime)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is None and src.is_vindex:
        return str(open_vindex(src.path).index["source"]["extracted_at"])
    if epoch is None:
        files = [p for p in src.path.rglob("*") if p.is_file()] if src.path.is_dir() else [src.path]
        epoch = str(int(max(f.stat().st_mtime for f in files)))
    return datetime.datetime.fromtimestamp(int(epoch), datetime.UTC).isoformat(timespec="seconds")


def _write_output(final: Path, out: Path, force: bool, vf: Vindexfile, stage: str | None, p: Plan) -> Path:
    """The output: the last step's files hard-linked, under an index.json with the cache's paths
    and clocks replaced by the inputs' (so two builds of the same inputs are byte-identical)."""
    src, steps = p.source, p.steps
    v = open_vindex(final)
    index: dict[str, Any] = {k: val for k, val in v.index.items() if k not in ("files", "sliced_from")}
    stamp = _stamp(src)
    frm = steps[0].instruction.arg  # type: ignore[union-attr]
    if not src.is_vindex:
        index["source"] = {**index["source"], "extracted_at": stamp}
    if "compiled_from" in index:
        index["compiled_from"] = {**index["compiled_from"], "path": frm, "compiled_at": stamp, "unsaved_edits": 0,
                                  "patches": [s.text for s in steps if s.name in EDITS]}
    if steps[-1].name == "EXPOSE" or "sliced_from" in v.index:
        index["sliced_from"] = {"path": frm, "preset": "browse" if steps[-1].name == "EXPOSE"
                                else v.index["sliced_from"]["preset"]}
    index["built_from"] = {"vindexfile_sha256": hashlib.sha256(vf.path.read_bytes()).hexdigest(), "stage": stage,
                           "steps": [s.text for s in steps], "key": steps[-1].key}
    validate_index({**index, "files": v.index["files"]}, f"{out}/index.json")  # before the output exists
    with VindexWriter(out, overwrite=force) as w:
        for name, entry in v.index["files"].items():
            w.link(name, v.path / name, entry)
        return w.finish(index)


__all__ = ["BuildReport", "Step", "StepRun", "build", "plan", "read_vindexfile"]
