"""The editing commands: crown, edit, memit, apply-patch, eval-edits (thin shells over LQL and larql.edit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import larql


@pytest.fixture(scope="module")
def tiny_inference(tiny_gguf: Path) -> Path:
    from larql.vindex.extract import extract

    return extract(tiny_gguf, tiny_gguf.parent / "ti.vindex", level="inference")


def test_crown_names_a_layer_per_site(tiny_inference: Path) -> None:
    r = larql("crown", str(tiny_inference), "Colour of zeta", "--expect", "blue", "--subject", "zeta", "--json")
    assert r.returncode == 0, r.stderr
    out = [json.loads(line) for line in r.stdout.splitlines()][-1]
    assert [row[0] for row in out["rows"]] == [0, 1]  # both layers of the tiny model, at both sites
    assert sum("crown" in str(row[3]) for row in out["rows"]) == 1
    assert sum("crown" in str(row[6]) for row in out["rows"]) == 1


def test_edit_saves_a_patch_that_apply_patch_compiles(tiny_inference: Path, tmp_path: Path) -> None:
    patch = tmp_path / "e.vlp"
    r = larql("edit", str(tiny_inference), "--subject", "zeta", "--relation", "colour", "--target", "blue",
              "--prompt", "Colour of zeta", "--save", str(patch), "--json")
    assert r.returncode == 0, r.stderr
    results = [json.loads(line) for line in r.stdout.splitlines()]
    assert results[2]["title"].startswith("Inserted 1 fact(s) by ROME weight edit at L1")
    assert "1 weight edits" in results[3]["title"]
    doc = json.loads(patch.read_text())
    assert doc["operations"][0]["op"] == "weight_edit" and doc["operations"][0]["facts"][0]["subject"] == "zeta"
    r = larql("apply-patch", str(tiny_inference), str(patch), "-o", str(tmp_path / "baked.vindex"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "baked.vindex" / "index.json").is_file()
    bad = larql("edit", str(tiny_inference), "--subject", "zeta", "--relation", "colour", "--target", "blue",
                "--prompt", "Water is")
    assert bad.returncode == 1 and "does not occur in the prompt" in bad.stderr and "Traceback" not in bad.stderr


def test_memit_and_eval_edits_read_an_edit_set(tiny_inference: Path, tmp_path: Path) -> None:
    edits = {"format": "larql-edit-set", "version": 1, "edits": [
        {"subject": "zeta", "prompt": "Colour of zeta", "target_new": "blue", "target_true": "red",
         "paraphrases": ["The colour of zeta"], "neighbours": [{"prompt": "Colour of omega", "target": "green"}]},
        {"subject": "kappa", "prompt": "Colour of kappa", "target_new": "gold"}]}
    path = tmp_path / "edits.json"
    path.write_text(json.dumps(edits))
    r = larql("memit", str(tiny_inference), str(path), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["title"].startswith("Inserted 2 fact(s) by MEMIT weight edit")
    r = larql("eval-edits", str(tiny_inference), str(path), "--protocols", "single", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["edits"] == 2 and set(report["single"]) >= {"S", "ES", "PS", "NS", "unrelated_kl"}
    assert report["stacked"] is None and len(report["per_edit"]) == 2
    path.write_text(json.dumps({"format": "larql-edit-set", "version": 1, "edits": [{"subject": "x"}]}))
    bad = larql("eval-edits", str(tiny_inference), str(path))
    assert bad.returncode == 1 and "fails its schema" in bad.stderr and "Traceback" not in bad.stderr


def test_eval_edits_scores_by_generation_and_held_out_perplexity(tiny_inference: Path, tmp_path: Path) -> None:
    edits = {"format": "larql-edit-set", "version": 1, "edits": [
        {"subject": "zeta", "prompt": "Colour of zeta", "target_new": "blue", "target_true": "red",
         "paraphrases": ["The colour of zeta"]}]}
    path, text = tmp_path / "edits.json", tmp_path / "held.txt"
    path.write_text(json.dumps(edits))
    text.write_text("The colour of omega is green, and the colour of kappa is gold. " * 4)
    r = larql("eval-edits", str(tiny_inference), str(path), "--protocols", "stacked", "--held-out", str(text), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    base, after = report["unedited"], report["stacked"]
    for row in (base, after):
        assert 0 <= row["gen_ES"] <= 100 and 0 <= row["gen_PS"] <= 100 and row["perplexity"] > 1
    assert after["perplexity_change"] == pytest.approx(100 * (after["perplexity"] / base["perplexity"] - 1))
    r = larql("eval-edits", str(tiny_inference), str(path), "--protocols", "stacked", "--no-perplexity")
    assert r.returncode == 0, r.stderr
    assert "gen_ES" in r.stdout and "perplexity_change" in r.stdout


def test_edit_without_method_uses_inserts_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """`larql edit` without --method writes an INSERT without METHOD, so it edits as LQL's INSERT
    does: the model's default (NEURON on gemma3-270m), not a CLI default of its own."""
    import larql.cli.edit as edit_cli
    from larql.cli.parser import build_parser
    from larql.edit.methods.defaults import default_method
    from larql.lql import ast
    from larql.lql.parser import parse

    texts: list[str] = []
    monkeypatch.setattr(edit_cli, "_lql", lambda args, text: texts.append(text) or 0)
    for extra in ([], ["--method", "rome"]):
        args = build_parser().parse_args(["edit", "gemma3-270m", "--subject", "France", "--relation", "capital",
                                          "--target", "Lyon", *extra])
        assert args.func(args) == 0
    inserts = [next(s for s in parse(t) if isinstance(s, ast.InsertStmt)) for t in texts]
    assert inserts[0].method is None and default_method("gemma3-270m") == "neuron"
    assert inserts[1].method == "rome"
