"""Features added to a layer (METHOD NEURON's): the overlay numbers them from the layer's width up and
needs them whole; the walk model runs them; patches carry them, and a second patch that adds from the
width up too is renumbered after the first rather than overwriting it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from larql.edit.patches.overlay import MAX_ADDED, FeatureOverride, MetaOverride
from larql.edit.patches.patch import PatchOp
from larql.edit.state.view import EditableVindex, edit_vindex
from larql.errors import VindexError
from tests.synthetic import TinySpec, tiny_vindex

FFN_WIDTH = 64
IDS = [2, 17, 40, 9, 33]


@pytest.fixture(scope="module")
def vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("added"), TinySpec("gemma3", n_layers=3, ffn=FFN_WIDTH), seed=3, dtype="f16")


def _feature(rng: np.random.Generator, hidden: int) -> dict[str, np.ndarray]:
    return {part: (2.0 * rng.standard_normal(hidden)).astype(np.float32) for part in ("gate", "up", "down")}


def _insert(layer: int, feature: int, vectors: dict[str, np.ndarray], tid: int = 5) -> PatchOp:
    return PatchOp("insert", layer, feature, vectors, MetaOverride((tid,), (0.5,)), "zeta", "colour", "blue",
                   reason="neuron: test")


def test_the_overlay_numbers_added_features_from_the_width_and_needs_them_whole(vx: Path) -> None:
    v = edit_vindex(vx)
    ov, rng = v.overlay, np.random.default_rng(0)
    assert ov.widths == [FFN_WIDTH] * 3 and ov.next_feature(1) == FFN_WIDTH
    with pytest.raises(VindexError, match="needs a gate, up and down vector \\(up, down missing\\)"):
        ov.set(1, FFN_WIDTH, FeatureOverride(gate=np.ones(v.hidden, np.float32)))
    with pytest.raises(VindexError, match="out of range"):
        ov.set(1, FFN_WIDTH + MAX_ADDED, FeatureOverride(**_feature(rng, v.hidden)))
    with pytest.raises(VindexError, match="out of range"):  # metadata only for a feature that exists
        ov.set_meta(1, FFN_WIDTH, MetaOverride((1,), (0.1,)))
    a, b = _feature(rng, v.hidden), _feature(rng, v.hidden)
    ov.set(1, FFN_WIDTH, FeatureOverride(**a))
    ov.set(1, FFN_WIDTH + 1, FeatureOverride(**b))
    ov.set(1, FFN_WIDTH, FeatureOverride(up=b["up"]))  # an added feature's part replaced, the rest kept
    assert np.array_equal(ov[(1, FFN_WIDTH)].gate, a["gate"]) and np.array_equal(ov[(1, FFN_WIDTH)].up, b["up"])
    g, u, d = ov.added_matrices(1)  # type: ignore[misc]
    assert np.array_equal(u[0], b["up"])
    assert g.shape == (2, v.hidden) and d.shape == (v.hidden, 2) and np.array_equal(d[:, 1], b["down"])
    assert ov.next_feature(1) == FFN_WIDTH + 2 and v.num_features(1) == FFN_WIDTH + 2 and len(ov) == 2
    assert not ov.layer(1) and ov.added_matrices(0) is None  # base overrides and other layers untouched
    ov.delete(1, FFN_WIDTH)  # a deleted added feature is gone, not silenced
    assert list(ov.added(1)) == [FFN_WIDTH + 1] and not ov.deleted(1) and ov.next_feature(1) == FFN_WIDTH + 2
    assert v.num_features(1) == FFN_WIDTH + 2  # the hole keeps its number (an empty row)
    ov.clear()
    assert ov.added_matrices(1) is None and v.num_features(1) == FFN_WIDTH


def _forward(v: EditableVindex) -> np.ndarray:
    return v.model().forward(IDS)


def test_patches_carry_added_features_and_a_second_patch_follows_the_first(vx: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    v = edit_vindex(vx)
    base = _forward(v)
    first, second = [_feature(rng, v.hidden) for _ in range(2)], [_feature(rng, v.hidden) for _ in range(2)]
    for name, feats in (("a.vlp", first), ("b.vlp", second)):  # both made on a fresh view: ids from the width up
        w = edit_vindex(vx)
        w.patches.begin(tmp_path / name)
        w.patches.record_all([_insert(2, FFN_WIDTH + j, f) for j, f in enumerate(feats)])
        w.patches.save()
    v.patches.apply(tmp_path / "a.vlp")
    only_a = _forward(v)
    assert not np.allclose(only_a, base, atol=1e-3)  # the features write something
    v.patches.apply(tmp_path / "b.vlp")
    assert list(v.overlay.added(2)) == [FFN_WIDTH + j for j in range(4)]  # b's follow a's
    assert np.array_equal(v.overlay[(2, FFN_WIDTH + 2)].down, second[0]["down"])
    # what an overlay holding all four computes
    direct = edit_vindex(vx)
    direct.patches.record_all([_insert(2, FFN_WIDTH + j, f) for j, f in enumerate(first + second)])
    assert np.array_equal(_forward(v), _forward(direct))
    assert v.feature_meta(2, FFN_WIDTH + 3).token_ids[0] == 5
    v.patches.remove("a.vlp")  # b's features stay (at their numbers), a's are gone
    assert list(v.overlay.added(2)) == [FFN_WIDTH + 2, FFN_WIDTH + 3]
    v.patches.remove("b.vlp")
    assert np.array_equal(_forward(v), base)
    assert json.loads((tmp_path / "a.vlp").read_text())["operations"][1]["feature"] == FFN_WIDTH + 1


def test_a_patch_adding_a_partial_feature_is_refused_whole(vx: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    v = edit_vindex(vx)
    v.patches.begin(tmp_path / "p.vlp")
    v.patches.record(_insert(0, FFN_WIDTH, _feature(rng, v.hidden)))
    v.patches.save()
    doc = json.loads((tmp_path / "p.vlp").read_text())
    doc["operations"].append({"op": "insert", "layer": 1, "feature": FFN_WIDTH, "entity": "x", "target": "y",
                              "gate_vector_b64": doc["operations"][0]["gate_vector_b64"]})
    (tmp_path / "bad.vlp").write_text(json.dumps(doc))
    fresh = edit_vindex(vx)
    base = _forward(fresh)
    with pytest.raises(VindexError, match="bad.vlp operation 1: feature 64 is past the layer's 64 features"):
        fresh.patches.apply(tmp_path / "bad.vlp")
    assert not fresh.patches.applied and len(fresh.overlay) == 0 and np.array_equal(_forward(fresh), base)


def test_compact_folds_added_features_and_changes_no_answer(vx: Path, tmp_path: Path) -> None:
    from larql.edit.maintain.compact import compact

    rng = np.random.default_rng(3)
    v = edit_vindex(vx)
    v.patches.begin(tmp_path / "c.vlp")
    v.patches.record_all([_insert(1, FFN_WIDTH + j, _feature(rng, v.hidden)) for j in range(3)])
    v.patches.save()
    v.patches.record(PatchOp("update", 1, FFN_WIDTH + 1, {"down": _feature(rng, v.hidden)["down"]}))
    v.patches.record(PatchOp("delete", 1, FFN_WIDTH))  # the applied patch's first one removed again
    v.patches.record(_insert(1, FFN_WIDTH + 3, _feature(rng, v.hidden)))
    v.patches.record(PatchOp("delete", 1, FFN_WIDTH + 3))  # added and removed within the edits
    before, added = _forward(v), list(v.overlay.added(1))
    assert added == [FFN_WIDTH + 1, FFN_WIDTH + 2]
    for level in ("minor", "major"):
        compact(v.patches, level)
        assert np.array_equal(_forward(v), before) and list(v.overlay.added(1)) == added
    assert [(op.op, op.feature) for op in v.patches.pending] == [("insert", FFN_WIDTH + 1), ("insert", FFN_WIDTH + 2)]


def test_explain_infer_ranks_added_features_with_the_model_s_own(vx: Path) -> None:
    from larql.edit.methods.capture import capture
    from larql.lql.executor import execute
    from larql.lql.session import Session
    from larql.model.ffn import gated
    from larql.model.forward import norm

    s = Session()
    execute(f'USE "{vx}"', s)
    v = s.vindex
    m = v.model()
    prompt = "Colour of zeta"
    ids = m.tokenize(prompt)
    resid = capture(m, ids, ["blocks.1.hook_resid_mid"])["blocks.1.hook_resid_mid"][-1]
    x = norm(m.config, resid[None, :], m.weights.layers[1].ffn_norm)[0]
    gate = (4.0 * x / float(x @ x)).astype(np.float32)  # gate . x = 4 at the prompt's last token
    ov = v.overlay
    ov.set(1, FFN_WIDTH + 2, FeatureOverride(gate, gate, np.ones(v.hidden, np.float32)))
    ov.set_meta(1, FFN_WIDTH + 2, MetaOverride((7,), (0.9,)))
    (res,) = execute(f'EXPLAIN INFER "{prompt}" LAYERS 1-1 TOP 2', s)
    top = res.rows[0]
    expected = float(gated(m.config.activation, np.array([[4.0]], np.float32), np.array([[4.0]], np.float32))[0, 0])
    assert top[:2] == [1, FFN_WIDTH + 2] and top[2] == pytest.approx(expected, rel=1e-4)
    assert top[3] == v.token_text(7).strip()
    assert res.rows[1][1] < FFN_WIDTH  # then the model's own


def test_a_patch_editing_another_patch_s_feature_and_removing_the_first(vx: Path, tmp_path: Path) -> None:
    """An update of a feature an earlier patch added keeps its number (only what a patch inserts is
    renumbered); removing the earlier patch while a later edit refers to its feature is refused and
    leaves the stack as it was."""
    rng = np.random.default_rng(4)
    w = edit_vindex(vx)
    w.patches.begin(tmp_path / "a.vlp")
    w.patches.record(_insert(1, FFN_WIDTH, _feature(rng, w.hidden)))
    w.patches.save()
    new_down = _feature(rng, w.hidden)["down"]
    w.patches.begin(tmp_path / "b.vlp")
    w.patches.record(PatchOp("update", 1, FFN_WIDTH, {"down": new_down}))
    w.patches.save()
    v = edit_vindex(vx)
    v.patches.apply(tmp_path / "a.vlp")
    v.patches.apply(tmp_path / "b.vlp")
    assert list(v.overlay.added(1)) == [FFN_WIDTH] and np.array_equal(v.overlay[(1, FFN_WIDTH)].down, new_down)
    v.patches.record(PatchOp("delete", 0, 3))
    before = _forward(v)
    with pytest.raises(VindexError, match="cannot remove a.vlp: a later edit refers to a feature it added"):
        v.patches.remove("a.vlp")
    assert [p.name for p in v.patches.applied] == ["a.vlp", "b.vlp"] and 3 in v.overlay.deleted(0)
    assert np.array_equal(_forward(v), before)


def test_browsing_and_filtered_deletes_skip_a_removed_feature_s_number(vx: Path) -> None:
    from larql.lql.executor import execute
    from larql.lql.session import Session

    rng = np.random.default_rng(5)
    s = Session()
    execute(f'USE "{vx}"', s)
    v = s.vindex
    v.patches.record_all([_insert(1, FFN_WIDTH + j, _feature(rng, v.hidden), tid=9) for j in range(2)])
    v.patches.record(PatchOp("delete", 1, FFN_WIDTH))  # leaves a hole at 64
    assert list(v.feature_ids(1))[-2:] == [FFN_WIDTH - 1, FFN_WIDTH + 1]
    v.patches.record_all([_insert(2, FFN_WIDTH + j, _feature(rng, v.hidden), tid=9) for j in (1, 0)])
    assert list(v.feature_ids(2))[-3:] == [FFN_WIDTH - 1, FFN_WIDTH, FFN_WIDTH + 1]  # id order, not the patch's
    execute("DELETE FROM EDGES WHERE layer = 1 AND score < 100", s)
    assert not v.overlay.added(1) and len(v.overlay.deleted(1)) == FFN_WIDTH  # every feature, the hole skipped


def test_a_removed_added_feature_is_named_as_such_and_long_lists_stay_one_line(vx: Path) -> None:
    rng = np.random.default_rng(6)
    ov = edit_vindex(vx).overlay
    for j in range(300):
        ov.set(2, FFN_WIDTH + j, FeatureOverride(**_feature(rng, ov.hidden)))
    ov.delete(2, FFN_WIDTH + 5)
    with pytest.raises(VindexError, match="feature 69 of layer 2 was added and then removed"):
        ov.set_meta(2, FFN_WIDTH + 5, MetaOverride((1,), (0.1,)))
    with pytest.raises(VindexError) as err:
        ov.set_meta(2, FFN_WIDTH + 400, MetaOverride((1,), (0.1,)))
    assert str(err.value) == ("feature 464 is out of range (layer 2: features 0-63, 299 added up to 363; "
                              "METHOD NEURON adds features)")


@pytest.mark.parametrize("level", ["inference", "browse"])
def test_a_feature_whose_down_vector_has_no_metadata_shows_the_tokens_it_writes(
        tmp_path_factory: pytest.TempPathFactory, level: str) -> None:
    """An added feature from a patch without down_meta, and a base feature whose down vector was
    replaced without metadata, show the top tokens of that vector over the unembedding (extraction's
    down_meta rule, exact scores), recomputed when the vector changes; one with metadata shows it."""
    path = tiny_vindex(tmp_path_factory.mktemp(level), TinySpec("gemma3", n_layers=3, ffn=FFN_WIDTH), seed=3,
                       level=level, dtype="f16")
    v = edit_vindex(path)
    rng = np.random.default_rng(4)
    unembed = v.store.embeddings.astype(np.float32)  # the tiny model ties them; its Q8_0 copy rounds alike
    if level == "inference":
        unembed = v.model().weights.output.dequantize()
    top_k = v.store.down_meta(1)[0].shape[1]

    def expected(down: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = unembed @ down
        order = np.argsort(-s, kind="stable")[:top_k]
        return order, s[order]

    added, base, labelled = _feature(rng, v.hidden), _feature(rng, v.hidden), _feature(rng, v.hidden)
    v.patches.record(PatchOp("insert", 1, FFN_WIDTH, added, None))
    v.patches.record(PatchOp("update", 1, 5, {"down": base["down"]}))
    v.patches.record(_insert(1, FFN_WIDTH + 1, labelled, tid=7))
    ids, scores = v.down_meta(1)
    for f, down in ((FFN_WIDTH, added["down"]), (5, base["down"])):
        want_ids, want_scores = expected(down)
        assert list(ids[f]) == list(want_ids)
        np.testing.assert_allclose(scores[f], want_scores, rtol=1e-4, atol=1e-4)
    assert ids[FFN_WIDTH + 1, 0] == 7 and scores[FFN_WIDTH + 1, 0] == np.float32(0.5)
    assert np.array_equal(ids[4], v.store.down_meta(1)[0][4])  # untouched features read the store
    v.patches.record(PatchOp("update", 1, 5, {"down": -base["down"]}))
    assert list(v.down_meta(1)[0][5]) == list(expected(-base["down"])[0])
    v.patches.record(PatchOp("update", 0, 3, {"down": base["down"]}))  # a layer with nothing added
    assert list(v.down_meta(0)[0][3]) == list(expected(base["down"])[0])
