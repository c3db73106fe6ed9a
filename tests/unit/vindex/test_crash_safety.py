"""kill -9 at random moments (seeded) during extract, SAVE PATCH, COMPILE INTO VINDEX, COMPILE
INTO MODEL (GGUF), `larql slice` and `larql build`, in a real subprocess that writes the same output
over and over (so a kill lands in any phase: writing the temporary, moving the old output aside,
renaming the new one in; for build also extracting into its cache and writing the cached patch).

After each kill the output path holds nothing or a complete artefact (it opens and verifies, or is
byte-identical to an uninterrupted run); the killed writer's `.NAME.tmp-PID` / `.NAME.old-PID` are
left beside it, and the next run of the same command removes them (their process is dead) and
writes a complete output."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from larql.edit.patches.patch import Shape, load_patch
from larql.io.tempfiles import TEMP_RE, clean_stale
from larql.lql.executor import execute
from larql.vindex.store import open_vindex
from larql.vindex.verify import verify_vindex
from tests.synthetic import TinySpec, tiny_vindex

ROOT = Path(__file__).resolve().parents[3]
SPEC = TinySpec("gemma3", n_layers=2, ffn=64)
KILLS = 3  # kills per operation, at seeded random moments


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("crash"), SPEC, seed=5, dtype="f32")


# what the child repeats forever: {out} is the output path, {base} the tiny vindex, {gguf} its model
OPS = {
    "extract": """
        from larql.vindex.extract import extract
        while True:
            extract({gguf!r}, {out!r}, level="inference", dtype="f32", overwrite=True)
    """,
    "save_patch": """
        from larql.lql.executor import execute
        from larql.lql.session import Session
        s = Session()
        execute('USE "{base}"', s)
        while True:
            execute('BEGIN PATCH "{out}" FORCE; DELETE FROM EDGES WHERE layer = 1; SAVE PATCH', s)
            s.vindex.patches.applied.clear()
    """,
    "compile_vindex": """
        from larql.lql.executor import execute
        from larql.lql.session import Session
        s = Session()
        execute('USE "{base}"; DELETE FROM EDGES WHERE layer = 0 AND feature = 3', s)
        while True:
            execute('COMPILE CURRENT INTO VINDEX "{out}" FORCE', s)
    """,
    "compile_gguf": """
        from larql.lql.executor import execute
        from larql.lql.session import Session
        s = Session()
        execute('USE "{base}"; DELETE FROM EDGES WHERE layer = 0 AND feature = 3', s)
        while True:
            execute('COMPILE CURRENT INTO MODEL "{out}" FORMAT GGUF FORCE', s)
    """,
    "slice": """
        from larql.vindex.slice import slice_vindex
        while True:  # client: browse + attention, so weights.bin is written, not only hard-linked
            slice_vindex({base!r}, {out!r}, preset="client", overwrite=True)
    """,
    "build": """
        from larql.vindexfile.run import build
        i = 0
        while True:  # a fresh cache each time: the kill lands in FROM's extract, the patch or the output
            build({project!r}, {out!r}, force=True, cache=f"{project}/caches/c{{i}}")
            i += 1
    """,
}
OUTPUTS = {"extract": "x.vindex", "save_patch": "p.vlp", "compile_vindex": "c.vindex", "compile_gguf": "c.gguf",
           "slice": "s.vindex", "build": "b.vindex"}
VINDEXFILE = "FROM m.gguf\nDELETE layer = 0 AND feature = 3\n"
ONCE = {  # the next run of the same command, in this process
    "extract": 'EXTRACT MODEL "{gguf}" INTO "{out}" WITH INFERENCE FORCE',
    "save_patch": 'USE "{base}"; BEGIN PATCH "{out}" FORCE; DELETE FROM EDGES WHERE layer = 1; SAVE PATCH',
    "compile_vindex": 'USE "{base}"; DELETE FROM EDGES WHERE layer = 0 AND feature = 3; '
                      'COMPILE CURRENT INTO VINDEX "{out}" FORCE',
    "compile_gguf": 'USE "{base}"; DELETE FROM EDGES WHERE layer = 0 AND feature = 3; '
                    'COMPILE CURRENT INTO MODEL "{out}" FORMAT GGUF FORCE',
}


def run_once(op: str, fmt: dict[str, str], cache: Path | None = None) -> None:
    """The next run of the same command, in this process."""
    if op == "slice":
        from larql.vindex.slice import slice_vindex

        slice_vindex(fmt["base"], fmt["out"], preset="client", overwrite=True)
    elif op == "build":
        from larql.vindexfile.run import build

        build(fmt["project"], fmt["out"], force=True, cache=cache)
    else:
        execute(ONCE[op].format(**fmt))


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if (m := TEMP_RE.match(p.name)) and m["name"] == out.name)


def files(path: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(path.iterdir())}


def check_complete(op: str, out: Path, base: Path, reference: bytes | dict[str, bytes] | None) -> str:
    """'absent', or 'complete' after checking the artefact thoroughly; fails the test otherwise."""
    if not os.path.lexists(out):
        return "absent"
    if op in ("slice", "build"):
        assert open_vindex(out).num_layers == SPEC.n_layers and verify_vindex(out).ok
        assert files(out) == reference  # what an uninterrupted run writes, file for file
    elif op in ("extract", "compile_vindex"):
        v = open_vindex(out)  # the seal and every file's sha256
        assert v.num_layers == SPEC.n_layers
        report = verify_vindex(out)  # re-reads every file, no cache
        assert report.ok, report
    elif op == "save_patch":
        v = open_vindex(base)
        patch = load_patch(out, Shape(v.hidden, int(v.index["intermediate_size"]), v.num_layers, v.vocab_size))
        assert len(patch.ops) == SPEC.ffn  # every feature of layer 1 deleted: the whole patch
    else:
        assert out.read_bytes() == reference  # the GGUF an uninterrupted run writes, byte for byte
    return "complete"


def cache_temps(out: Path, pid: int) -> bool:
    """Whether the build child `pid` is writing a cache entry (FROM's extract, the patch, the compile)."""
    caches = out.parent / "proj" / "caches"
    return caches.is_dir() and any(f".tmp-{pid}" in e.name for c in caches.iterdir() for e in c.iterdir())


def kill_at_random(op: str, out: Path, base: Path, rng: random.Random, env: dict[str, str], writing: bool,
                   in_cache: bool = False) -> None:
    """Start the child, wait for its first temporary, then SIGKILL it after a random delay (anywhere
    in the loop), or with `writing`, at the first moment after that delay its temporary exists (with
    `in_cache`, a build's cache entry's temporary)."""
    code = textwrap.dedent(OPS[op]).format(out=str(out), base=str(base), gguf=str(base.parent / "m.gguf"),
                                           project=str(out.parent / "proj"))
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stderr=subprocess.PIPE)

    def writing_now() -> bool:
        return cache_temps(out, child.pid) if in_cache else (out.parent / f".{out.name}.tmp-{child.pid}").exists()

    try:
        deadline = time.monotonic() + 60
        while not (out.parent / f".{out.name}.tmp-{child.pid}").exists():
            assert child.poll() is None, child.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, f"{op}: no temporary appeared"
            time.sleep(0.0005)
        time.sleep(rng.uniform(0, 0.25))
        while writing and not writing_now() and time.monotonic() < deadline:
            time.sleep(0.0002)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stderr.close()  # type: ignore[union-attr]
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize("op", list(OPS))
def test_kill_9_leaves_nothing_or_a_complete_output_and_the_next_run_cleans_up(
        op: str, base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / OUTPUTS[op]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1", "LARQL_CACHE": str(tmp_path / "cache")}
    monkeypatch.setenv("LARQL_CACHE", str(tmp_path / "cache"))
    fmt = {"out": str(out), "base": str(base), "gguf": str(base.parent / "m.gguf"), "project": str(tmp_path / "proj")}
    reference: bytes | dict[str, bytes] | None = None
    if op == "build":
        (tmp_path / "proj").mkdir()
        (tmp_path / "proj" / "m.gguf").symlink_to(base.parent / "m.gguf")
        (tmp_path / "proj" / "Vindexfile").write_text(VINDEXFILE)
    if op in ("compile_gguf", "slice", "build"):  # an uninterrupted run, for the byte comparison
        ref = tmp_path / ("ref" + Path(OUTPUTS[op]).suffix)
        run_once(op, {**fmt, "out": str(ref)}, tmp_path / "ref-cache")
        reference = ref.read_bytes() if op == "compile_gguf" else files(ref)
    rng = random.Random(f"crash-{op}")
    seen, left = [], []
    cached_left = []
    for i in range(KILLS + (op == "build")):  # build: kills in the output, anywhere, in a cache entry
        kill_at_random(op, out, base, rng, env, writing=i % 2 == 0, in_cache=op == "build" and i == 2)
        seen.append(check_complete(op, out, base, reference))
        left += leftovers(out)
        if op == "build":
            cached_left += [e.name for c in (tmp_path / "proj" / "caches").iterdir() for e in c.iterdir()
                            if TEMP_RE.match(e.name)]
    if op != "save_patch":  # a patch is written in well under a millisecond: a kill seldom catches it
        assert left, "no kill caught a write in progress: the test tested nothing"
    if op == "build":  # every cache entry is absent or complete too, and the next build on it cleans up
        assert cached_left, "no kill caught a cache entry being written"
        for cache in sorted((tmp_path / "proj" / "caches").iterdir()):
            check_cache(cache, base)
            run_once(op, fmt, cache)
            assert [p.name for p in cache.iterdir() if TEMP_RE.match(p.name)] == []
    # the next run of the same command removes what the dead writers left and writes a whole output
    run_once(op, fmt)
    assert leftovers(out) == []
    assert check_complete(op, out, base, reference) == "complete"
    assert set(seen) <= {"absent", "complete"}


def check_cache(cache: Path, base: Path) -> None:
    """Each entry a killed build left in its cache is complete (a later build takes it as it is)."""
    v = open_vindex(base)
    for entry in cache.iterdir():
        if TEMP_RE.match(entry.name):
            continue  # a dead writer's temporary: the next build of that entry removes it
        if entry.suffix == ".vindex":
            assert verify_vindex(entry).ok, entry
        else:
            patch = load_patch(entry, Shape(v.hidden, int(v.index["intermediate_size"]), v.num_layers, v.vocab_size))
            assert len(patch.ops) == 1, entry


def test_clean_stale_keeps_live_writers_and_restores_a_moved_aside_output(tmp_path: Path) -> None:
    out = tmp_path / "o.vlp"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a process that has exited
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / f".o.vlp.tmp-{dead_pid}").write_text("half")
        (tmp_path / f".o.vlp.old-{dead_pid}").write_text("the old, complete output")
        (tmp_path / f".o.vlp.tmp-{live.pid}").write_text("being written")
        (tmp_path / f".other.vlp.tmp-{dead_pid}").write_text("another output's")
        clean_stale(out)
        assert out.read_text() == "the old, complete output"  # moved aside, then killed: put back
        assert leftovers(out) == [f".o.vlp.tmp-{live.pid}"]  # a live writer's temporary is its own
        assert (tmp_path / f".other.vlp.tmp-{dead_pid}").exists()  # only the target's own
    finally:
        live.kill()
        live.wait()
    clean_stale(out)
    assert leftovers(out) == []
