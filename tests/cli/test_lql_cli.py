"""`larql lql` one-shot: tables, JSON, files, and errors with carets and a non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import larql


@pytest.fixture(scope="module")
def vx(tiny_vindex: Path) -> Path:
    return tiny_vindex


def test_tables_and_json(vx: Path) -> None:
    r = larql("lql", f'USE "{vx}"; SHOW LAYERS; SELECT * FROM EDGES LIMIT 3;', "--width", "120")
    assert r.returncode == 0, r.stderr
    assert "Using:" in r.stdout and "┃ layer" in r.stdout
    r = larql("lql", "--json", f'USE "{vx}"; SELECT * FROM FEATURES WHERE layer = 1 LIMIT 2')
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 2 and lines[1]["columns"][:2] == ["layer", "feature"] and len(lines[1]["rows"]) == 2


def test_script_file_and_show_models(vx: Path, tmp_path: Path) -> None:
    script = tmp_path / "s.lql"
    script.write_text(f'-- a script\nUSE "{vx}";\nSTATS;\n')
    r = larql("lql", "-f", str(script))
    assert r.returncode == 0 and "model weights" in r.stdout
    r = larql("lql", "SHOW MODELS", "--json", cwd=vx.parent)
    assert json.loads(r.stdout)["rows"][0][1] == "t.vindex"


def test_errors_exit_nonzero_with_caret(vx: Path) -> None:
    r = larql("lql", f'USE "{vx}"; DESCRIBE France;')
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "LqlSyntaxError: 1:" in r.stderr and "expected a quoted entity after DESCRIBE" in r.stderr
    assert r.stderr.rstrip().endswith("^") and r.stdout == ""
    r = larql("lql", 'DESCRIBE "France"')
    assert r.returncode == 1 and "no vindex in use" in r.stderr and 'hint: run USE "path/to.vindex"' in r.stderr
    r = larql("lql", "-f", "/nonexistent.lql")
    assert r.returncode == 1 and "cannot read" in r.stderr


def test_editing_errors_exit_nonzero(vx: Path, tmp_path: Path) -> None:
    r = larql("lql", f'USE "{vx}"; APPLY PATCH "{tmp_path / "missing.vlp"}";')
    assert r.returncode == 1 and "Traceback" not in r.stderr and "no such patch file" in r.stderr
    r = larql("lql", f'USE "{vx}"; INSERT INTO EDGES (entity, relation, target) VALUES ("a", "b", "c");')
    assert r.returncode == 1 and "INSERT needs model weights, and the vindex in use is browse-level" in r.stderr
    r = larql("lql", f'USE "{vx}"; DELETE FROM EDGES WHERE layer = 0 AND feature = 1; SAVE PATCH;', "--width", "200")
    assert r.returncode == 1 and "no patch is being recorded" in r.stderr and "Deleted 1 feature(s)" in r.stdout
    out = tmp_path / "d.vlp"
    r = larql("lql", f'USE "{vx}"; BEGIN PATCH "{out}"; DELETE FROM EDGES WHERE layer = 0 AND feature = 1; SAVE PATCH;')
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["operations"] == [{"op": "delete", "layer": 0, "feature": 1,
                                                          "reason": "DELETE 1 slot(s)"}]


def test_formats_csv_markdown_and_json_as_the_json_option(vx: Path) -> None:
    text = f'USE "{vx}"; SHOW LAYERS; SELECT * FROM EDGES LIMIT 3'
    r = larql("lql", "--format", "csv", text)
    assert r.returncode == 0, r.stderr
    blocks = r.stdout.split("\n\n")  # USE has no columns: two CSV blocks
    assert len(blocks) == 2 and blocks[0].splitlines()[0] == "layer,band,features,top_token,top_token_count"
    assert len(blocks[1].splitlines()) == 4
    r = larql("lql", "--format", "markdown", text)
    assert r.returncode == 0 and r.stdout.startswith("- Using:") and "| layer | band |" in r.stdout
    def untimed(out: str) -> list[dict]:
        return [{k: v for k, v in json.loads(line).items() if k != "elapsed_ms"} for line in out.splitlines()]

    as_json = larql("lql", "--format", "json", text)
    assert as_json.returncode == 0 and untimed(as_json.stdout) == untimed(larql("lql", "--json", text).stdout)
    assert untimed(larql("--json", "lql", "--format", "json", text).stdout) == untimed(as_json.stdout)
    r = larql("lql", "--json", "--format", "csv", text)
    assert r.returncode == 2 and "--json and --format csv" in r.stderr and r.stdout == ""


def test_use_sae_and_its_errors(tiny_gguf: Path, tmp_path: Path) -> None:
    from tests.sae_files import random_tensors, v6_cfg, write_sae

    good = write_sae(tmp_path / "good", random_tensors(64, 16, 1), v6_cfg(64, 16, hook="blocks.1.hook_resid_post"))
    r = larql("lql", "--json", f'USE MODEL "{tiny_gguf}"; USE SAE "{good}" AT LAYER 1; SHOW SAES;')
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["rows"] == [["blocks.1.hook_resid_post", "SAE", "blocks.1.hook_resid_post",
                                                              1, "standard", 64, 16, None, 0, str(good)]]
    wide = write_sae(tmp_path / "wide", random_tensors(32, 16, 1), v6_cfg(32, 16, hook="blocks.1.hook_resid_post"))
    for statement, message in [(f'USE SAE "{wide}"', "d_in = 32, but blocks.1.hook_resid_post of this model has "
                                                     "width 64 (an SAE trained for another model"),
                               (f'USE SAE "{good}" AT LAYER 0', "is at layer 1, not layer 0; drop AT LAYER 0"),
                               (f'USE SAE "{tmp_path}"', "no cfg.json")]:
        r = larql("lql", f'USE MODEL "{tiny_gguf}"; {statement};')
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        first = r.stderr.splitlines()[0]  # the error in one line, then the hint and the caret
        assert first.startswith("larql: LqlSemanticError: 1:") and message in first, r.stderr
