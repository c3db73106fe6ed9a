"""`larql extract` and `larql verify` in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.conftest import larql


def test_extract_verify_and_run_from_vindex(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.vindex"
    r = larql("extract", str(tiny_gguf), "-o", str(out), "--level", "inference", "--quiet")
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stderr
    assert json.loads((out / "index.json").read_text())["extract_level"] == "inference"
    r = larql("verify", str(out))
    assert r.returncode == 0 and f"ok (6 files match index.json; model_config matches the source {tiny_gguf}" in r.stdout
    direct = json.loads(larql("run", str(tiny_gguf), "abc", "--max-tokens", "5", "--json").stdout)
    via_vindex = json.loads(larql("run", str(out), "abc", "--max-tokens", "5", "--json").stdout)
    assert via_vindex["ids"] == direct["ids"]
    # one code path with EXTRACT MODEL ... INTO: the same extraction is reused, a different one refused
    index = (out / "index.json").read_text()
    again = larql("extract", str(tiny_gguf), "-o", str(out), "--level", "inference", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["reused"] is True
    lql = larql("lql", f'EXTRACT MODEL "{tiny_gguf}" INTO "{out}" WITH INFERENCE')
    assert lql.returncode == 0 and "already holds this model at level inference: using it" in lql.stdout
    assert (out / "index.json").read_text() == index
    other = larql("extract", str(tiny_gguf), "-o", str(out), "--quiet")  # browse, the shared default level
    assert other.returncode == 1 and "already holds a different vindex" in other.stderr and "--force" in other.stderr
    lql = larql("lql", f'EXTRACT MODEL "{tiny_gguf}" INTO "{out}"')
    assert lql.returncode == 1 and "already holds a different vindex" in lql.stderr
    forced = larql("extract", str(tiny_gguf), "-o", str(out), "--force", "--json")
    assert forced.returncode == 0 and json.loads(forced.stdout)["reused"] is False
    assert json.loads((out / "index.json").read_text())["extract_level"] == "browse"


def test_verify_reports_corruption_and_repairs(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.vindex"
    assert larql("extract", str(tiny_gguf), "-o", str(out), "--quiet").returncode == 0
    intact = (out / "gate_vectors.bin").read_bytes()
    for name, at in (("gate_vectors.bin", 64), ("embeddings.bin", 8)):
        data = bytearray((out / name).read_bytes())
        data[at] ^= 1
        (out / name).write_bytes(bytes(data))
    r = larql("verify", str(out))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr == (f"larql: error: {out}: embeddings.bin (contents differ from its sha256); gate_vectors.bin "
                        f"(contents differ from its sha256); repair with larql verify --repair {out}, or re-extract it\n")
    opened = larql("lql", f'USE "{out}"; STATS;')
    assert opened.returncode == 1 and "embeddings.bin: contents differ from the sha256 in index.json" in opened.stderr
    r = larql("verify", "--repair", str(out))
    assert r.returncode == 0 and "repaired (embeddings.bin" in r.stdout, r.stderr
    assert (out / "gate_vectors.bin").read_bytes() == intact
    assert larql("verify", str(out)).returncode == 0


def test_quant_q4k_that_would_change_nothing_is_refused(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.vindex"
    r = larql("extract", str(tiny_gguf), "-o", str(out), "--level", "inference", "--quant", "q4k", "--quiet")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == ("larql: error: --quant q4k would change nothing in tiny.gguf: its layer matrices are "
                                "already at or below Q4_K/Q6_K's bits per weight, or their rows are not whole "
                                "256-weight blocks; use --quant source")
    assert list(tmp_path.iterdir()) == []
