"""Fuzz the LQL parser and executor with seeded mutations (tests/fuzz/lql_fuzz.py): every input
parses or raises an LqlError, fast; the executor lets nothing but LarqlErrors escape.

Fixed seeds and bounded counts keep this to ~15 s; `python -m tests.fuzz.lql_fuzz --count 60000`
is the long run."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from larql.edit.state.view import edit_vindex
from larql.lql.session import Session
from larql.vindex.extract import extract
from tests.fuzz.lql_fuzz import EXECUTOR_SEEDS, fuzz_executor, fuzz_parser, mutations
from tests.synthetic import TinySpec, hf_weights, write_gguf

PARSE_BOUND_S = 0.5  # the target is 100 ms; generous so that a loaded CI machine does not flake


def _summary(r) -> str:  # type: ignore[no-untyped-def]
    kinds = "; ".join(f"{n} x {k}: {r.examples[k][:120]!r}" for k, n in r.failures.most_common())
    return f"{r.inputs} inputs, {r.parsed} ok, {r.rejected} LarqlError, failures: {kinds or 'none'}"


def test_parser_never_crashes_and_is_fast() -> None:
    r = fuzz_parser(mutations(6000, seed=0))
    print(f"\nparser fuzz: {_summary(r)}; max parse {r.max_time * 1e3:.1f} ms")
    assert not r.failures, _summary(r)
    assert r.parsed > 300 and r.rejected > 3000  # the mutations reach both outcomes
    slowest_time, slowest = r.slowest(1)[0]
    assert slowest_time < PARSE_BOUND_S, f"{slowest_time * 1e3:.0f} ms to parse {slowest[:200]!r}"


@pytest.fixture(scope="module")
def tiny_vindexes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzzx")
    spec = TinySpec("gemma3", n_layers=4, ffn=96)
    write_gguf(root / "m.gguf", spec, hf_weights(spec, seed=2), gguf.GGMLQuantizationType.Q8_0)
    return {level: extract(root / "m.gguf", root / f"{level}.vindex", level=level) for level in ("browse", "inference")}


@pytest.mark.parametrize("level, count", [("browse", 3000), ("inference", 500)])
def test_executor_raises_only_larql_errors(tiny_vindexes: dict[str, Path], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch, level: str, count: int) -> None:
    vx = tiny_vindexes[level]
    monkeypatch.chdir(tmp_path)  # patches, traces and outputs land here
    v = edit_vindex(vx)  # one vindex for all inputs: edits pile up, as in a long session
    seeds = [s.replace("{vx}", str(vx)) for s in EXECUTOR_SEEDS]
    r = fuzz_executor(mutations(count, seed=1, seeds=seeds), lambda: Session(vindex=v))
    print(f"\nexecutor fuzz ({level}): {_summary(r)}")
    assert not r.failures, _summary(r)
    assert r.parsed > 10 and r.rejected > 10


@pytest.mark.parametrize("path, says", [("/nonexistent-dir/t.json", "No such file or directory"), (".", "names a directory"),
                                        ("x" * 241 + ".json", "longer than 240 bytes")])
def test_file_errors_are_one_line_larql_errors(tiny_vindexes: dict[str, Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, path: str, says: str) -> None:
    from larql.errors import LqlError
    from larql.lql.executor import execute

    monkeypatch.chdir(tmp_path)
    with pytest.raises(LqlError) as info:
        execute(f'USE "{tiny_vindexes["inference"]}"; TRACE "hello" POSITIONS ALL SAVE "{path}"')
    assert says in str(info.value).splitlines()[0]
    assert "tmp-" not in str(info.value)  # the path as written, not larql's temporary name
