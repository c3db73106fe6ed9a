"""Cold start: `larql --help` and LQL parsing/planning load none of the heavy libraries, and the
LQL parser's tables are cached across processes (written atomically, skipped when unwritable).
Times are measured in benchmarks/bench_coldstart.py, never asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from larql.io.cachedir import cache_dir

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "numba", "faiss", "tokenizers", "llvmlite")


def _fresh(code: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """Run `code` in a new interpreter importing this checkout's larql, with its own cache directory."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          check=False, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "LARQL_CACHE": str(cache)})


def _loaded_after(call: str, cache: Path) -> list[str]:
    code = (f"import sys\nfrom larql.cli import main\ntry:\n    main({call})\nexcept SystemExit:\n    pass\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))")
    r = _fresh(code, cache)
    assert r.returncode == 0, r.stderr
    return eval(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_help_loads_no_heavy_library(tmp_path: Path) -> None:
    assert _loaded_after("['--help']", tmp_path) == []
    assert _loaded_after("['extract', '--help']", tmp_path) == []
    code = ("import sys\nfrom larql.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('lark' in sys.modules, 'rich' in sys.modules)")
    assert _fresh(code, tmp_path).stdout.strip().endswith("False False")  # nor the parser or the tables


def test_planning_without_a_vindex_loads_no_heavy_library(tmp_path: Path) -> None:
    plan = "['lql', '--plan', 'SHOW MODELS; EXTRACT MODEL \"gemma3-270m\" INTO \"g.vindex\";']"
    assert _loaded_after(plan, tmp_path) == []


def test_the_parser_tables_are_cached_once_and_reused(tmp_path: Path) -> None:
    code = "from larql.lql import parse\nprint(len(parse('DESCRIBE \"France\"; STATS')))"
    first = _fresh(code, tmp_path)
    assert first.returncode == 0 and first.stdout.strip() == "2", first.stderr
    files = sorted(tmp_path.iterdir())
    assert [f.name.startswith("lql-grammar-") and f.suffix == ".lark" for f in files] == [True]  # no .tmp left
    stamp = files[0].stat().st_mtime_ns
    again = _fresh(code + "\nfrom larql.lql.parser import lark_parser\nprint(lark_parser().source_path)", tmp_path)
    assert again.stdout.split() == ["2", "<deserialized>"], again.stderr  # loaded from the file, not rebuilt
    assert files[0].stat().st_mtime_ns == stamp and sorted(tmp_path.iterdir()) == files


def test_a_damaged_cache_file_is_rebuilt(tmp_path: Path) -> None:
    code = "from larql.lql import parse\nprint(len(parse('STATS')))"
    assert _fresh(code, tmp_path).returncode == 0
    (cached,) = tmp_path.iterdir()
    cached.write_bytes(cached.read_bytes()[:1000])  # as if a writer had died half-way
    r = _fresh(code, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
    assert cached.stat().st_size > 1000 and len(list(tmp_path.iterdir())) == 1


def test_an_unwritable_cache_only_costs_time(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = _fresh("from larql.lql import parse\nprint(len(parse('STATS')))", blocker / "cache")
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr


def test_cache_dir_follows_larql_cache_then_xdg() -> None:
    assert cache_dir({"LARQL_CACHE": "/x/c", "XDG_CACHE_HOME": "/y"}) == Path("/x/c")
    assert cache_dir({"XDG_CACHE_HOME": "/y", "HOME": "/h"}) == Path("/y/larql")
    assert cache_dir({"XDG_CACHE_HOME": "relative", "HOME": "/h"}) == Path("/h/.cache/larql")
    assert cache_dir({"HOME": "/h"}) == Path("/h/.cache/larql")


def _with_numba_cache(code: str, numba_cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "NUMBA_CACHE_DIR": str(numba_cache),
           "LARQL_CACHE": str(numba_cache.parent / "larql"), "NUMBA_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *(["-c", code] if code else []), *args], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, check=False, env=env)


def test_the_second_process_compiles_what_a_run_reaches_last(tmp_path: Path) -> None:
    numba_cache = tmp_path / "numba"
    check = "from larql.model.prewarm import kernels_cached\nprint(kernels_cached())"
    assert _with_numba_cache(check, numba_cache).stdout.strip() == "False"  # a fresh install
    child = _with_numba_cache("", numba_cache, "-m", "larql.model.prewarm", "gemma3-270m")
    assert child.returncode == 0, child.stderr
    # a generation afterwards compiles the rest, and none of the second process's kernels
    run = ("import sys\nfrom larql.cli import main\nfrom numba.core.registry import CPUDispatcher\n"
           "try:\n    main(['run', 'gemma3-270m', 'The capital of France is', '--max-tokens', '3'])\n"
           "except SystemExit:\n    pass\n"
           "import gc\nmisses = sorted(d.py_func.__qualname__ for d in gc.get_objects() if isinstance(d, CPUDispatcher)"
           " and d.py_func.__module__.startswith('larql') and sum(d.stats.cache_misses.values()))\nprint(misses)")
    got = _with_numba_cache(run, numba_cache)
    assert got.returncode == 0 and "capital" in got.stdout, got.stdout + got.stderr
    compiled = eval(got.stdout.strip().splitlines()[-1])
    assert "decode_qk" in compiled and "rms_norm_rows" in compiled  # the first process's share
    # Gemma's last type met is Q6_K (its matvec straight from the blocks), and the lm_head's greedy argmax
    assert not {"q8_0_candidates", "quantize_q8", "_select", "matvec_q6_k"} & set(compiled), compiled
    assert _with_numba_cache(check, numba_cache).stdout.strip() == "True"


def test_no_second_process_when_turned_off() -> None:
    import os

    from larql.model import prewarm

    old = os.environ.get(prewarm.ENV_VAR)
    os.environ[prewarm.ENV_VAR] = "0"
    try:
        assert prewarm.start("gemma3-270m") is None
    finally:
        os.environ.pop(prewarm.ENV_VAR) if old is None else os.environ.__setitem__(prewarm.ENV_VAR, old)


def test_no_second_process_for_a_directory_or_a_bad_name(tmp_path: Path) -> None:
    from larql.model import prewarm

    assert prewarm.start(str(tmp_path)) is None  # an HF directory or a vindex: nothing the second process shares
    assert prewarm.start(str(tmp_path / "missing.gguf")) is None
