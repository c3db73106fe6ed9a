"""`larql build` on a tiny model: the cache, byte-identical outputs, atomic failures, LABELS,
EXPOSE and stages, each checked on what the output vindex holds."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from larql.edit.state.view import edit_vindex
from larql.errors import BuildError
from larql.lql.executor import execute
from larql.lql.session import Session
from larql.vindex.store import open_vindex
from larql.vindexfile.run import build
from tests.synthetic import TinySpec, hf_weights, write_gguf

SPEC = TinySpec("gemma3", n_layers=4, ffn=96)
INSERT = 'INSERT INTO EDGES (entity, relation, target) VALUES ("zeta", "colour", "blue") AT LAYER 2 METHOD FEATURE'


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("build") / "m.gguf"
    write_gguf(path, SPEC, hf_weights(SPEC, seed=11), gguf.GGMLQuantizationType.Q8_0)
    return path


def project(tmp_path: Path, model: Path, body: str, labels: list[dict] | None = None) -> Path:
    d = tmp_path / "proj"
    d.mkdir()
    (d / "m.gguf").symlink_to(model)
    (d / "Vindexfile").write_text(f"FROM m.gguf\n{body}")
    if labels is not None:
        (d / "labels.json").write_text(json.dumps(labels))
    return d


def files(path: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(path.iterdir())}


def test_edits_labels_and_the_cache(model: Path, tmp_path: Path) -> None:
    d = project(tmp_path, model, f"DELETE layer = 1 AND feature = 7\n{INSERT}\nLABELS labels.json\n",
                [{"layer": 3, "feature": 4, "label": "colour-of"}])
    cold = build(d, tmp_path / "a.vindex")
    assert [(r.step.name, r.cached) for r in cold.runs] == [
        ("FROM", False), ("DELETE", False), ("INSERT", False), ("COMPILE", False), ("LABELS", False)]
    warm = build(d, tmp_path / "b.vindex")
    assert warm.ran == [] and len(warm.runs) == 5  # nothing redone: every step came from the cache
    assert files(tmp_path / "a.vindex") == files(tmp_path / "b.vindex")

    # the output is the base with the edits baked in: what the same LQL on the base shows
    base = edit_vindex(d / ".larql-build" / (cold.runs[0].step.key[:40] + ".vindex"))
    s = Session(vindex=base)
    execute(f"DELETE FROM EDGES WHERE layer = 1 AND feature = 7; {INSERT}", s)
    ids = [5, 80, 81, 120]
    built = open_vindex(tmp_path / "a.vindex")
    np.testing.assert_allclose(edit_vindex(built.path).model().forward(ids), base.model().forward(ids), atol=1e-4)
    assert not built.down_meta(1)[0][7].any()  # the deleted feature writes nothing
    assert built.feature_label(3, 4) == "colour-of" and built.feature_label(3, 5) != "colour-of"
    assert built.index["built_from"]["steps"][1:3] == ["DELETE FROM EDGES WHERE layer = 1 AND feature = 7", INSERT]

    # changing a later input redoes only the steps from it on
    (d / "labels.json").write_text(json.dumps([{"layer": 0, "feature": 1, "label": "other"}]))
    third = build(d, tmp_path / "c.vindex")
    assert [r.step.name for r in third.ran] == ["LABELS"]
    assert open_vindex(tmp_path / "c.vindex").feature_label(0, 1) == "other"


def test_same_inputs_give_the_same_bytes_without_a_shared_cache(model: Path, tmp_path: Path) -> None:
    d = project(tmp_path, model, "PATCH p.vlp\nEXPOSE browse\n")
    s = Session()
    execute(f'USE "{_extract(model, tmp_path)}"; BEGIN PATCH "{d / "p.vlp"}"; '
            "DELETE FROM EDGES WHERE layer = 2 AND feature = 3; SAVE PATCH", s)
    one = build(d, tmp_path / "one.vindex", cache=tmp_path / "cache1")
    two = build(d, tmp_path / "two.vindex", cache=tmp_path / "cache2")
    assert len(one.ran) == len(two.ran) == 3  # FROM, PATCH, COMPILE: both built from nothing
    assert files(tmp_path / "one.vindex") == files(tmp_path / "two.vindex")
    v = open_vindex(tmp_path / "one.vindex")
    # EXPOSE browse, and no INSERT needs weights: the model was extracted at the browse level only
    assert v.index["extract_level"] == "browse" and not v.has_model_weights
    assert "weights.bin" not in v.index["files"] and not v.down_meta(2)[0][3].any()
    assert v.index["built_from"]["steps"][0] == "FROM m.gguf (extract, browse)"


def _extract(model: Path, tmp_path: Path) -> Path:
    from larql.vindex.extract import extract

    return extract(model, tmp_path / "base.vindex", level="browse")


def test_from_a_vindex_uses_it_in_place_and_a_stage_stops_early(model: Path, tmp_path: Path) -> None:
    base = _extract(model, tmp_path)
    before = files(base)
    d = tmp_path / "proj"
    d.mkdir()
    (d / "Vindexfile").write_text(f'FROM "{base}"\nSTAGE dev\nDELETE layer = 0 AND feature = 2\n'
                                  "STAGE prod\nDELETE layer = 0 AND feature = 3\n")
    r = build(d, tmp_path / "dev.vindex", stage="dev")
    assert [x.step.name for x in r.runs] == ["FROM", "DELETE", "COMPILE"] and r.runs[0].cached
    dev = open_vindex(tmp_path / "dev.vindex")
    assert not dev.down_meta(0)[0][2].any() and dev.down_meta(0)[0][3].any()
    assert dev.index["built_from"]["stage"] == "dev"
    assert files(base) == before  # the base vindex is read, never written


@pytest.mark.parametrize(("body", "message"), [
    ("DELETE layer = 0 AND feature = 2\nPATCH missing.vlp\n", "Vindexfile:3: PATCH missing.vlp: no such file"),
    ("DELETE layer = 0 AND feature = 2\nDELETE layer = 9 AND feature = 1\n",
     "Vindexfile:3: DELETE FROM EDGES WHERE layer = 9 AND feature = 1: the vindex built so far: layer 9 out of range"),
    ("LABELS labels.json\n", "labels.json entry 0: feature must be an integer in 0..95 at layer 0, got 500"),
    ("DELETE layer = 0 AND feature = 2\nPACH x.vlp\n", 'Vindexfile:3: unknown instruction "PACH"; did you mean PATCH?'),
])
def test_a_failure_leaves_no_output(model: Path, tmp_path: Path, body: str, message: str) -> None:
    d = project(tmp_path, model, body, [{"layer": 0, "feature": 500, "label": "x"}])
    out = tmp_path / "out" / "x.vindex"
    with pytest.raises(BuildError) as e:
        build(d, out)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not out.exists() and not (tmp_path / "out").exists()
    leftovers = [p.name for p in (d / ".larql-build").rglob("*") if ".tmp-" in p.name] if (d / ".larql-build").exists() else []
    assert leftovers == []


def test_an_existing_output_is_refused_without_force(model: Path, tmp_path: Path) -> None:
    d = project(tmp_path, model, "EXPOSE browse\n")
    (tmp_path / "o.vindex").mkdir()
    with pytest.raises(BuildError, match="o.vindex: already exists; choose another --output or pass --force"):
        build(d, tmp_path / "o.vindex")
    assert not (d / ".larql-build").exists()  # refused before any work
    build(d, tmp_path / "o.vindex", force=True)
    assert open_vindex(tmp_path / "o.vindex").index["extract_level"] == "browse"


def test_expose_browse_slices_an_inference_build(model: Path, tmp_path: Path) -> None:
    d = project(tmp_path, model, f"{INSERT}\nEXPOSE browse\n")
    r = build(d, tmp_path / "a.vindex")
    assert [x.step.name for x in r.runs] == ["FROM", "INSERT", "COMPILE", "EXPOSE"]
    assert r.runs[0].step.text == "FROM m.gguf (extract, inference)"  # the INSERT needs the weights
    v = open_vindex(tmp_path / "a.vindex")
    assert not v.has_model_weights and "weights.bin" not in v.index["files"]
    assert v.index["sliced_from"] == {"path": "m.gguf", "preset": "browse"} and v.index["parts"][0] == "tokenizer"


def test_a_cached_vindex_covers_the_steps_before_it(model: Path, tmp_path: Path) -> None:
    d = project(tmp_path, model, f"DELETE layer = 1 AND feature = 7\n{INSERT}\n")
    build(d, tmp_path / "a.vindex")
    for patch in (d / ".larql-build").glob("*.vlp"):
        patch.unlink()  # the INSERT's patch is gone, but COMPILE's vindex already holds it
    again = build(d, tmp_path / "b.vindex")
    assert again.ran == [] and files(tmp_path / "a.vindex") == files(tmp_path / "b.vindex")


def test_from_an_hf_directory_and_its_cache_key_follows_the_bytes(tmp_path: Path) -> None:
    from tests.synthetic import write_hf_dir

    d = tmp_path / "proj"
    write_hf_dir(d / "hf", SPEC, hf_weights(SPEC, seed=11))
    (d / "Vindexfile").write_text("FROM hf   # an HF directory\nEXPOSE browse\n")
    first = build(d, tmp_path / "a.vindex")
    assert [r.step.text for r in first.ran] == ["FROM hf (extract, browse)"]
    assert open_vindex(tmp_path / "a.vindex").index["num_layers"] == SPEC.n_layers
    assert build(d, tmp_path / "b.vindex").ran == []
    (d / "hf" / "config.json").write_text((d / "hf" / "config.json").read_text() + "\n")  # one byte more
    assert [r.step.name for r in build(d, tmp_path / "c.vindex").ran] == ["FROM"]


def test_a_patch_for_another_model_is_refused_at_its_line(model: Path, tmp_path: Path) -> None:
    d = project(tmp_path, model, "DELETE layer = 0 AND feature = 2\nPATCH other.vlp\n")
    (d / "other.vlp").write_text(json.dumps({"format": "larql-patch", "version": 1, "base_model": "some-other-model",
                                             "operations": [{"op": "delete", "layer": 0, "feature": 1}]}))
    with pytest.raises(BuildError, match=r"Vindexfile:3: PATCH other.vlp: .*other.vlp: this patch was made for "
                                         r"'some-other-model'"):
        build(d, tmp_path / "o.vindex")
    assert not (tmp_path / "o.vindex").exists()
