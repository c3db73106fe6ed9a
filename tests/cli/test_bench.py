"""`larql bench` end to end on the tiny model: it prints the speed table and the machine,
and says how to install llama.cpp's bindings when they are missing. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

from larql.cli.benchmark import LLAMA_CPP_INSTALL, describe_run, llama_cpp_tier, llama_cpp_version, table
from tests.cli.conftest import larql


def test_bench_prints_the_speed_table(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    r = larql("bench", str(tiny_gguf), "--prompt", "16", "--decode", "4", "--out", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("prefill 16 tokens, greedy decode 4 tokens;") and "threads" in lines[0]
    assert lines[1] == "| model | engine | prefill tok/s | decode tok/s | decode vs llama.cpp |"
    assert lines[3].startswith(f"| {tiny_gguf} | larql | ")
    saved = json.loads(out.read_text())
    assert {"platform", "cpu", "cpus", "isa", "threads", "load_average"} <= set(saved["machine"])
    assert saved["engines"][0]["decode_tok_s"] > 0 and saved["engines"][0]["prefill_tok_s"] > 0
    if llama_cpp_version() is None:
        assert "llama_cpp_system" not in saved
        assert r.stderr.strip().endswith(f"llama-cpp-python is not installed ({LLAMA_CPP_INSTALL})")
        assert len(saved["engines"]) == 1
    elif saved["peer_errors"]:  # llama.cpp did not load the tiny model: said, and larql's row kept
        assert f"llama.cpp not measured on {tiny_gguf}: " in r.stderr
        assert [e["engine"] for e in saved["engines"]] == ["larql"]
    else:
        assert [e["engine"] for e in saved["engines"]] == ["larql", "llama.cpp"]
    if llama_cpp_version() is not None:  # the peer's build is recorded beside its figures
        assert saved["llama_cpp_tier"] in {"avx512vnni", "avx512", "avxvnni", "avx2", "other"}


def test_bench_json_and_bad_arguments(tiny_gguf: Path) -> None:
    r = larql("bench", str(tiny_gguf), "--prompt", "16", "--decode", "2", "--no-peers", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert [e["engine"] for e in json.loads(r.stdout)["engines"]] == ["larql"]
    assert larql("bench", str(tiny_gguf), "--prompt", "4").returncode == 2
    assert larql("bench", str(tiny_gguf), "--rounds", "0").returncode == 2
    too_long = larql("bench", str(tiny_gguf), "--prompt", "60", "--decode", "8")
    assert too_long.returncode == 1 and "exceed the context of 64" in too_long.stderr


def test_the_table_compares_decode_with_llama_cpp() -> None:
    rows = [{"model": "m", "engine": "larql", "prefill_tok_s": 400.0, "decode_tok_s": 55.0},
            {"model": "m", "engine": "llama.cpp", "prefill_tok_s": 600.0, "decode_tok_s": 50.0}]
    assert table(rows).splitlines()[2:] == ["| m | larql | 400 | 55.0 | 1.10x |", "| m | llama.cpp | 600 | 50.0 | 1.00x |"]


def test_rounds_are_medians_with_every_round_kept(tiny_gguf: Path) -> None:
    r = larql("bench", str(tiny_gguf), "--prompt", "16", "--decode", "2", "--rounds", "3", "--no-peers", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    (e,) = result["engines"]
    assert result["rounds"] == 3 and len(e["decode_rounds"]) == len(e["prefill_rounds"]) == 3
    assert e["decode_tok_s"] == sorted(e["decode_rounds"])[1] and e["prefill_tok_s"] == sorted(e["prefill_rounds"])[1]
    assert "medians of 3 rounds in turn" in describe_run(result) and " -> " in describe_run(result)


def test_the_table_shows_the_rounds_spread() -> None:
    rows = [{"model": "m", "engine": "larql", "prefill_tok_s": 400.0, "decode_tok_s": 55.0,
             "prefill_rounds": [390.0, 400.0, 410.0], "decode_rounds": [50.0, 55.0, 60.0]},
            {"model": "m", "engine": "llama.cpp", "prefill_tok_s": 600.0, "decode_tok_s": 50.0,
             "prefill_rounds": [600.0], "decode_rounds": [50.0]}]
    assert table(rows).splitlines()[2:] == ["| m | larql | 400 (390-410) | 55.0 (50.0-60.0) | 1.10x |",
                                            "| m | llama.cpp | 600 | 50.0 | 1.00x |"]


def test_the_peer_build_is_named_by_its_widest_int8_form() -> None:
    """A llama.cpp compiled without AVX-512 on an AVX-512 machine runs its AVX2 kernels: the results
    file says so from the build's system info, not from the CPU."""
    native = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
              "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |")
    avx2 = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 |"
    assert llama_cpp_tier(native) == "avx512vnni" and llama_cpp_tier(avx2) == "avx2"
    assert llama_cpp_tier("CPU : AVX2 = 1 | AVX512 = 0 | AVX512_VNNI = 0 |") == "avx2"
    assert llama_cpp_tier("CPU : AVX2 = 1 | AVX512 = 1 |") == "avx512"
    assert llama_cpp_tier("CPU : NEON = 1 | ARM_FMA = 1 | DOTPROD = 1 |") == "other"
    result = {"machine": {"cpu": "c", "cpus": 2, "threads": 2, "isa": "avx2", "load_average": [1.0]},
              "prompt": 16, "decode": 4, "llama_cpp_tier": "avx2"}
    assert "threads, larql tier avx2, llama.cpp built for avx2, load average" in describe_run(result)


def test_llama_cpp_failing_in_its_process_is_one_error(tmp_path: Path) -> None:
    """llama.cpp runs in a child process: a file it cannot load (or, without llama-cpp-python, the
    missing module) comes back as one RuntimeError naming why, which `run_bench` files under
    peer_errors, not a traceback."""
    import pytest

    from larql.cli.benchmark import bench_llamacpp

    with pytest.raises(RuntimeError, match="Error") as e:
        bench_llamacpp("m", str(tmp_path / "missing.gguf"), [1, 2, 3], 1, 1)
    assert "\n" not in str(e.value)
