"""ROME / MEMIT weight edits end to end on a tiny model: LQL INSERT ... METHOD ROME / MEMIT, the
weight_edit patch operation (save, apply, remove, bit for bit), held keys across stacked edits,
COMPILE, and bad input leaving the overlay exactly as it was."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import larql
from larql.edit.insert import insert_facts
from larql.edit.methods.facts import Fact
from larql.edit.patches.weight_op import WeightOp
from larql.edit.state.view import edit_vindex
from larql.errors import EditError, LqlSemanticError, VindexError
from larql.lql.executor import execute
from larql.lql.session import Session
from larql.model.targets import target_ids
from tests.synthetic import TinySpec, tiny_vindex

# the subject ends the prompt: on a random tiny model, attention from later positions is noise
PROMPT = "Colour of zeta"


@pytest.fixture(scope="module")
def vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("rome"), TinySpec("gemma3", n_layers=4, ffn=96), seed=5, dtype="f16")


def _logp_target(m: larql.Model, prompt: str, target: str) -> float:
    """Teacher-forced log-probability of every token of " " + target after the prompt."""
    ids, toks = m.tokenize(prompt), target_ids(m, target)
    logits = m.forward(ids + toks[:-1]).astype(np.float64)
    logp = logits - logits.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    return float(sum(logp[len(ids) - 1 + i, t] for i, t in enumerate(toks)))


def test_rome_insert_through_lql_is_a_removable_weight_edit(vx: Path, tmp_path: Path) -> None:
    s = Session()
    execute(f'USE "{vx}"; BEGIN PATCH "{tmp_path / "w.vlp"}"', s)
    m = s.vindex.model()
    base = m.forward(m.tokenize(PROMPT))
    before = _logp_target(m, PROMPT, "blue")
    res = execute('INSERT INTO EDGES (entity, relation, target, prompt) VALUES ("zeta", "colour", "blue", "Colour of zeta") METHOD ROME', s)[0]
    after = _logp_target(m, PROMPT, "blue")
    # every token of the whole target is taught (a random tiny model's peaked distributions move
    # slowly: tests/parity/test_weight_edits.py asserts efficacy on the real model)
    assert after > before + 2.0, (before, after)
    assert res.rows[0][0] == "zeta -[colour]-> blue"
    assert res.rows[0][2] == pytest.approx(np.exp(after), rel=1e-3)  # the report is what the model now says
    op = s.vindex.patches.pending[-1]
    assert isinstance(op, WeightOp) and op.rank == 1 and op.facts[0]["target"] == "blue"
    assert not np.array_equal(m.forward(m.tokenize(PROMPT)), base)

    saved = execute("SAVE PATCH; SHOW PATCHES", s)
    assert "1 weight edits" in saved[0].title
    assert saved[1].rows[0][-2] == "zeta -[colour]-> blue"  # SHOW PATCHES lists the facts
    edited = m.forward(m.tokenize(PROMPT))
    fresh = edit_vindex(vx)
    fresh.patches.apply(tmp_path / "w.vlp")
    fm = fresh.model()
    assert np.array_equal(fm.forward(fm.tokenize(PROMPT)), edited)  # the patch carries the edit exactly
    fresh.patches.remove("w.vlp")
    assert np.array_equal(fm.forward(fm.tokenize(PROMPT)), base)  # and removes it bit for bit

    compiled = execute(f'COMPILE CURRENT INTO VINDEX "{tmp_path / "baked.vindex"}"', s)[0]
    assert {r[0]: r[1] for r in compiled.rows}["layers with rewritten FFN weights"] == "1"
    out = larql.load(tmp_path / "baked.vindex").forward(m.tokenize(PROMPT))
    assert np.max(np.abs(out - edited)) <= 1e-4 * np.max(np.abs(edited))


def test_stacked_edits_hold_earlier_keys_and_memit_solves_a_batch(vx: Path) -> None:
    v = edit_vindex(vx)
    m = v.model()
    first = Fact("zeta", PROMPT, "blue", "colour")
    untaught = _logp_target(m, PROMPT, "blue")
    insert_facts(v, [first], "rome", measure=False)
    taught = _logp_target(m, PROMPT, "blue")
    k1 = v.overlay.held_keys(1)[:, 0]
    u1, v1 = v.overlay.down_delta(1)
    insert_facts(v, [Fact("omega", "Colour of omega", "red", "colour")], "rome", measure=False)
    u, vv = v.overlay.down_delta(1)
    second = u[:, 1:] @ vv[:, 1:].T
    # the second edit leaves the first one's key where it was (dW k1 = 0)
    assert np.linalg.norm(second @ k1) <= 1e-3 * np.linalg.norm(u1 @ (v1.T @ k1))
    kept = _logp_target(m, PROMPT, "blue")  # the first fact keeps (nearly all of) what it gained
    assert abs(kept - taught) < 0.1 * (taught - untaught), (untaught, taught, kept)

    batch = edit_vindex(vx)
    facts = [Fact("alpha", "Colour of alpha", "green"), Fact("kappa", "Colour of kappa", "gold")]
    rep = insert_facts(batch, facts, "memit")
    assert len(batch.patches.pending) == 1 and batch.patches.pending[0].rank == 2  # one joint rank-2 update
    assert all(f.p_after > f.p_before for f in rep.facts), [(f.fact.label, f.p_after) for f in rep.facts]
    assert rep.unrelated_total > 0


def test_bad_edits_leave_the_overlay_as_it_was(vx: Path, tmp_path: Path) -> None:
    s = Session()
    execute(f'USE "{vx}"', s)
    with pytest.raises(LqlSemanticError, match="does not occur in the prompt"):
        execute('INSERT INTO EDGES (entity, relation, target, prompt) VALUES ("zeta", "colour", "blue", "Water is") '
                'METHOD ROME', s)
    with pytest.raises(EditError, match="non-empty target"):
        Fact("zeta", PROMPT, "  ")
    assert s.vindex.patches.pending == [] and s.vindex.overlay.weight_layers() == []
    bad = {"format": "larql-patch", "version": 1, "operations": [
        {"op": "weight_edit", "layer": 1, "rank": 1, "u_b64": "", "v_b64": "", "keys_b64": ""}]}
    (tmp_path / "bad.vlp").write_text(json.dumps(bad))
    with pytest.raises(VindexError, match="holds 0 values"):
        s.vindex.patches.apply(tmp_path / "bad.vlp")
    nan = np.full(64, np.nan, np.float32)
    with pytest.raises(VindexError, match="NaN"):
        s.vindex.overlay.add_weight(1, nan[:, None], np.ones((96, 1), np.float32), np.ones((96, 1), np.float32))
    assert s.vindex.patches.applied == [] and s.vindex.overlay.weight_layers() == []


def test_insert_layers_spreads_one_edit_over_a_range(vx: Path) -> None:
    s = Session()
    execute(f'USE "{vx}"', s)
    m = s.vindex.model()
    before = _logp_target(m, PROMPT, "blue")
    res = execute('INSERT INTO EDGES (entity, relation, target, prompt) VALUES ("zeta", "colour", "blue", '
                  '"Colour of zeta") LAYERS 1-2 METHOD MEMIT', s)[0]
    ops = s.vindex.patches.pending
    assert sorted(op.layer for op in ops) == [1, 2] and all(isinstance(op, WeightOp) for op in ops)
    assert "L1, L2" in res.title
    assert _logp_target(m, PROMPT, "blue") > before + 2.0
    s.vindex.patches.undo(len(ops))
