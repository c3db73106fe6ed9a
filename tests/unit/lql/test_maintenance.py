"""MERGE, COMPACT, SHOW COMPACT STATUS and REBALANCE on the tiny inference-level vindex: merged facts
answer, FAIL leaves the session as it was, COMPACT changes no answer, REBALANCE reports and records
what it measured.

A random tiny model's distributions are extremely peaked: facts are compared by their logits and
log-probabilities, not by reaching a probability (tests/parity does that on gemma3-270m)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from larql.edit.methods.feature import ffn_inputs
from larql.edit.patches.overlay import MetaOverride
from larql.edit.patches.patch import PatchOp
from larql.edit.patches.weight_op import WeightOp
from larql.errors import LqlSemanticError
from larql.lql.executor import execute
from larql.lql.session import Session

ZETA = "The colour of zeta is"
IDS = [5, 80, 81, 120, 7, 7, 9]


def insert(entity: str, target: str, layer: int = 2) -> str:
    return (f'INSERT INTO EDGES (entity, relation, target) VALUES ("{entity}", "colour", "{target}") '
            f"AT LAYER {layer} METHOD FEATURE")


def session(vxi: Path, *statements: str) -> Session:
    s = Session()
    execute(f'USE "{vxi}"', s)
    for text in statements:
        execute(text, s)
    return s


def logits(s: Session, prompt: str = ZETA) -> np.ndarray:
    m = s.vindex.model()
    return m.next_logits(m.tokenize(prompt))


def logp(s: Session, prompt: str, target_id: int) -> float:
    x = logits(s, prompt).astype(np.float64)
    return float(x[target_id] - (x.max() + np.log(np.exp(x - x.max()).sum())))


@pytest.fixture(scope="module")
def blue(vxi: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, int]:
    """a.vlp: zeta -[colour]-> blue at layer 2; the logits it gives on ZETA; blue's token id."""
    path = tmp_path_factory.mktemp("merge") / "a.vlp"
    s = session(vxi, insert("zeta", "blue"), f'BEGIN PATCH "{path}"', "SAVE PATCH")
    op = next(o for o in s.vindex.patches.applied[0].ops if o.op == "insert")
    return path, logits(s), op.meta.token_ids[0]


def test_merge_a_patch_adds_its_fact(vxi: Path, blue: tuple[Path, np.ndarray, int]) -> None:
    path, _, tid = blue
    s = session(vxi, insert("omega", "red", layer=1))
    base = session(vxi)
    (res,) = execute(f'MERGE "{path}"', s)
    assert res.rows == [] and "0 conflict(s)" in res.title and "1 recorded" in res.notes[0]
    assert logp(s, ZETA, tid) - logp(base, ZETA, tid) > 5.0  # the merged fact answers
    assert any(op.entity == "omega" for op in s.vindex.patches.pending)  # the session's own fact stays
    before = logits(s)
    (again,) = execute(f'MERGE "{path}"', s)  # merging twice changes nothing
    assert "0 recorded" in again.notes[0] and "1 already present" in again.notes[0]
    assert np.array_equal(logits(s), before)


def test_merge_moves_another_fact_out_of_a_shared_slot(vxi: Path, blue: tuple[Path, np.ndarray, int]) -> None:
    path, _, tid = blue
    s = session(vxi, insert("omega", "red"))  # a fresh session takes the same least-used feature as a.vlp
    mine = s.vindex.patches.pending[-1]
    (res,) = execute(f'MERGE "{path}" ON CONFLICT FAIL', s)  # not a conflict: nothing fails
    ((layer, moved, kind, current, incoming, winner),) = res.rows
    assert (layer, kind, winner) == (2, "moved", "both") and "omega -[colour]-> red" in current
    assert incoming == "zeta -[colour]-> blue" and moved.startswith(f"{mine.feature} -> ")
    new = int(moved.split(" -> ")[1])
    assert new != mine.feature and {mine.feature, new} <= set(s.vindex.overlay.layer(2))
    assert logp(s, ZETA, tid) - logp(session(vxi), ZETA, tid) > 5.0 and "REBALANCE AT LAYER 2" in res.notes[0]


def green(vxi: Path, path: Path, c: float) -> Session:
    """A session holding another edit of a.vlp's slot: zeta -[colour]-> green, claiming c_score `c`
    (on the tiny byte-level vocabulary every INSERT target starts with the same token, so INSERT
    itself would install the very same feature)."""
    op = next(o for o in json.loads(path.read_text())["operations"] if o["op"] == "insert")
    s = session(vxi)
    rng = np.random.default_rng(5)
    vec = {k: rng.standard_normal(64).astype(np.float32) for k in ("gate", "up", "down")}
    s.vindex.patches.record(PatchOp("insert", op["layer"], op["feature"], vec, MetaOverride((70,), (c,)),
                                    "zeta", "colour", "green"))
    return s


def test_merge_conflicts_per_policy(vxi: Path, blue: tuple[Path, np.ndarray, int]) -> None:
    path, want, _ = blue
    g = green(vxi, path, 0.99)
    pending, before = list(g.vindex.patches.pending), logits(g)
    with pytest.raises(LqlSemanticError) as e:
        execute(f'MERGE "{path}" ON CONFLICT FAIL', g)
    assert "1 conflict(s)" in str(e.value) and "current zeta -[colour]-> green (c 0.99)" in str(e.value)
    assert "incoming zeta -[colour]-> blue" in str(e.value) and "nothing was merged" in str(e.value)
    assert g.vindex.patches.pending == pending and np.array_equal(logits(g), before)

    (kept,) = execute(f'MERGE "{path}" ON CONFLICT KEEP_CURRENT', g)
    assert [r[2] for r in kept.rows] == ["slot"] and kept.rows[0][5] == "current"
    assert "zeta -[colour]-> green" in kept.rows[0][3] and "zeta -[colour]-> blue" in kept.rows[0][4]
    assert np.array_equal(logits(g), before) and "1 skipped" in kept.notes[0]

    (hc,) = execute(f'MERGE "{path}" ON CONFLICT HIGHEST_CONFIDENCE', g)  # 0.99 beats blue's p
    assert hc.rows[0][5] == "current" and np.array_equal(logits(g), before)

    (won,) = execute(f'MERGE "{path}"', g)  # LAST_WINS, the default
    assert won.rows[0][5] == "incoming" and "LAST_WINS" in won.title
    np.testing.assert_allclose(logits(g), want, rtol=0, atol=1e-5)  # the session now answers as a.vlp

    low = green(vxi, path, -1.0)  # blue claims its p when installed (0.0 on a tiny model)
    (hc,) = execute(f'MERGE "{path}" ON CONFLICT HIGHEST_CONFIDENCE', low)
    assert hc.rows[0][5] == "incoming"
    np.testing.assert_allclose(logits(low), want, rtol=0, atol=1e-5)


def test_merge_a_fact_at_another_slot_deletes_the_loser(vxi: Path, blue: tuple[Path, np.ndarray, int]) -> None:
    path, _, _ = blue
    s = session(vxi, insert("zeta", "green", layer=1))  # the same fact, another layer: a fact conflict
    (res,) = execute(f'MERGE "{path}"', s)
    assert [r[2] for r in res.rows] == ["fact"] and res.rows[0][0] == 1 and res.rows[0][5] == "incoming"
    slot = res.rows[0][0], res.rows[0][1]
    assert slot[1] in s.vindex.overlay.deleted(slot[0])


def test_merge_a_compiled_vindex_reproduces_it(vxi: Path, blue: tuple[Path, np.ndarray, int], tmp_path: Path) -> None:
    path, _, _ = blue
    src = session(vxi, f'APPLY PATCH "{path}"')
    rng = np.random.default_rng(3)
    w = rng.standard_normal((96, 1)).astype(np.float32)
    src.vindex.patches.record(WeightOp(3, 0.1 * rng.standard_normal((64, 1)).astype(np.float32), w, w))
    execute(f'COMPILE CURRENT INTO VINDEX "{tmp_path / "c.vindex"}"', src)
    s = session(vxi)
    (res,) = execute(f'MERGE "{tmp_path / "c.vindex"}"', s)
    assert res.title.startswith("Merged vindex") and res.rows == []
    want = src.vindex.model().forward(IDS)
    assert np.max(np.abs(s.vindex.model().forward(IDS) - want)) <= 1e-5 * np.max(np.abs(want))


def test_merge_bad_sources(vxi: Path, tmp_path: Path) -> None:
    s = session(vxi)
    with pytest.raises(LqlSemanticError, match="no such file or vindex; name a .vindex directory or a .vlp file"):
        execute(f'MERGE "{tmp_path / "nope.vlp"}"', s)
    other = tmp_path / "other.vlp"
    other.write_text(json.dumps({"format": "larql-patch", "version": 1, "base_model": "another-model",
                                 "operations": []}))
    with pytest.raises(LqlSemanticError, match="made for 'another-model'"):
        execute(f'MERGE "{other}"', s)
    with pytest.raises(LqlSemanticError, match="MERGE ... INTO is not supported"):
        execute(f'MERGE "{other}" INTO "x.vindex"', s)
    assert s.vindex.patches.pending == []


def test_compact_changes_no_answer(vxi: Path, blue: tuple[Path, np.ndarray, int]) -> None:
    path, _, _ = blue
    s = session(vxi, f'APPLY PATCH "{path}"', insert("omega", "red"), insert("omega", "red"),
                'UPDATE EDGES SET confidence = 0.5 WHERE layer = 0 AND feature = 5',
                "DELETE FROM EDGES WHERE layer = 3 AND feature = 9")
    rng = np.random.default_rng(4)
    for _ in range(2):
        w = rng.standard_normal((96, 1)).astype(np.float32)
        s.vindex.patches.record(WeightOp(1, 0.1 * rng.standard_normal((64, 1)).astype(np.float32), w, w))
    s.vindex.patches.record(PatchOp("update", 0, 5, {"gate": rng.standard_normal(64).astype(np.float32)}))
    prompts = [ZETA, "The colour of omega is", "hello world"]
    before = [logits(s, p) for p in prompts]
    browse = 'SELECT * FROM EDGES WHERE layer IN (0, 2, 3) LIMIT 1000; WALK "zeta" TOP 5'
    browse_before = [r.rows for r in execute(browse, s)]
    (status,) = execute("SHOW COMPACT STATUS", s)
    now, minor, major = (r[1:] for r in status.rows)
    (res,) = execute("COMPACT MINOR", s)
    assert len(s.vindex.patches.applied) == 1 and res.rows[1][1:] == [now[1], minor[1]] and minor[1] < now[1]
    assert all(np.array_equal(logits(s, p), b) for p, b in zip(prompts, before))
    (res,) = execute("COMPACT", s)  # MAJOR
    stack = s.vindex.patches
    assert (stack.applied, len(stack.pending)) == ([], major[1]) and major[0] == 1 < now[0]
    assert all(np.array_equal(logits(s, p), b) for p, b in zip(prompts, before))
    assert [r.rows for r in execute(browse, s)] == browse_before  # DESCRIBE needs a longer context
    assert sum(1 for op in stack.pending if isinstance(op, WeightOp)) == 1  # two weight edits joined
    assert {op.entity for op in stack.pending if isinstance(op, PatchOp)} >= {"zeta", "omega"}
    with pytest.raises(LqlSemanticError, match="WITH LAMBDA is not supported"):
        execute("COMPACT MAJOR WITH LAMBDA = 0.001", s)


def test_rebalance_reports_and_records(vxi: Path) -> None:
    s = session(vxi, insert("zeta", "blue"), insert("omega", "red"))
    (res,) = execute("REBALANCE AT LAYER 2 FLOOR 0 CEILING 0.000000000001 MAX 4", s)
    assert [r[0] for r in res.rows] == ["zeta -[colour]-> blue", "omega -[colour]-> red"] or \
        [r[0] for r in res.rows] == ["omega -[colour]-> red", "zeta -[colour]-> blue"]
    assert res.title.startswith("Rebalanced 2 fact(s) at layer 2")
    m = s.vindex.model()
    for fact, layer, feature, p_before, p_after, factor in res.rows:
        entity, target = fact.split(" ")[0], fact.split("> ")[1]
        meta = s.vindex.overlay.meta(layer)[feature]
        p_now = float(np.exp(logp(s, f"The colour of {entity} is", meta.token_ids[0])))
        assert p_now == pytest.approx(p_after, rel=1e-6, abs=1e-12)  # what was reported is what was recorded
        if p_before > 1e-12:
            assert factor < 1.0  # above the ceiling: the down vector shrank
        assert m.tokenizer is not None and target
    # each gate is silent on the other fact's prompt
    h = {r[0].split(" ")[0]: ffn_inputs(m, [f"The colour of {r[0].split(' ')[0]} is"], 2, True)[0][0] for r in res.rows}
    for fact, layer, feature, *_ in res.rows:
        gate = s.vindex.overlay[(layer, feature)].gate
        own, other = (float(gate @ x) for x in (h[fact.split(" ")[0]], *(v for k, v in h.items() if k != fact.split(" ")[0])))
        assert own > 1.0 and other <= 1e-3 * own
    (none,) = execute("REBALANCE AT LAYER 0", s)
    assert none.rows == [] and "no feature inserts" in none.notes[0]


def test_rebalance_needs_weights(vx: Path) -> None:
    with pytest.raises(LqlSemanticError, match="REBALANCE needs model weights"):
        execute(f'USE "{vx}"; REBALANCE')


def test_compact_on_a_browse_vindex_keeps_describe(vx: Path, tmp_path: Path) -> None:
    s = Session()
    execute(f'USE "{vx}"; BEGIN PATCH "{tmp_path / "d.vlp"}"; DELETE FROM EDGES WHERE layer = 1 AND feature = 4; '
            "SAVE PATCH; UPDATE EDGES SET confidence = 0.25 WHERE layer = 2 AND feature = 7; "
            "UPDATE EDGES SET confidence = 0.5 WHERE layer = 2 AND feature = 7", s)
    look = 'DESCRIBE "hello" VERBOSE; WALK "hello" TOP 4; SELECT * FROM EDGES WHERE layer IN (1, 2) LIMIT 500'
    before = [r.rows for r in execute(look, s)]
    (res,) = execute("COMPACT MAJOR", s)
    assert res.rows[1][1:] == [3, 2] and res.rows[0][1:] == [2, 1]
    assert [r.rows for r in execute(look, s)] == before
    assert s.vindex.feature_meta(2, 7).scores[0] == pytest.approx(0.5) and 4 in s.vindex.overlay.deleted(1)


def test_merge_a_fact_a_weight_edit_holds(vxi: Path, blue: tuple[Path, np.ndarray, int]) -> None:
    path, _, _ = blue
    s = session(vxi)
    rng = np.random.default_rng(6)
    w = rng.standard_normal((96, 1)).astype(np.float32)
    fact = {"subject": "zeta", "relation": "colour", "prompt": ZETA, "target": "green"}
    s.vindex.patches.record(WeightOp(1, 0.1 * rng.standard_normal((64, 1)).astype(np.float32), w, w, (fact,)))
    with pytest.raises(LqlSemanticError, match=r"L1 weight edit: current zeta -\[colour\]-> green \(weight edit\)"):
        execute(f'MERGE "{path}" ON CONFLICT FAIL', s)
    (kept,) = execute(f'MERGE "{path}" ON CONFLICT KEEP_CURRENT', s)
    assert kept.rows[0][1:3] == ["weight edit", "fact"] and kept.rows[0][5] == "current" and len(s.vindex.patches.pending) == 1
    (hc,) = execute(f'MERGE "{path}" ON CONFLICT HIGHEST_CONFIDENCE', s)  # a weight edit claims no c_score
    assert hc.rows[0][5] == "incoming" and any("weight edit teaching 'green' stays" in n for n in hc.notes)


def test_merge_numbers_an_added_feature_after_the_ones_in_place(vxi: Path, tmp_path: Path) -> None:
    """Two sessions that each added a feature (METHOD NEURON) numbered it from the layer's width: the
    incoming one is added after the session's, not written over it nor into a base feature."""
    rng = np.random.default_rng(7)

    def neuron(s: Session, entity: str, tid: int) -> PatchOp:
        width = s.vindex.overlay.widths[2]
        vec = {k: (3.0 * rng.standard_normal(64)).astype(np.float32) for k in ("gate", "up", "down")}
        op = PatchOp("insert", 2, width, vec, MetaOverride((tid,), (0.5,)), entity, "colour", "blue", reason="neuron: x")
        s.vindex.patches.record(op)
        return op

    other = session(vxi, f'BEGIN PATCH "{tmp_path / "n.vlp"}"')
    theirs = neuron(other, "zeta", 70)
    execute("SAVE PATCH", other)
    s = session(vxi)
    mine = neuron(s, "omega", 71)
    (res,) = execute(f'MERGE "{tmp_path / "n.vlp"}"', s)
    assert [row[1] for row in res.rows] == [f"{mine.feature} -> {mine.feature + 1}"]
    ov = s.vindex.overlay
    assert list(ov.added(2)) == [mine.feature, mine.feature + 1] and not ov.layer(2)
    assert np.array_equal(ov[(2, mine.feature)].down, mine.vectors["down"])
    assert np.array_equal(ov[(2, mine.feature + 1)].down, theirs.vectors["down"])


def test_merge_moves_an_added_feature_without_a_fact_off_the_session_s_own(vxi: Path, tmp_path: Path) -> None:
    """A DIFF of a vindex compiled with neurons gives its added features as inserts with no fact: one at
    a number the session added a different feature at is another feature and goes after it; the
    same feature merged again is already present."""
    rng = np.random.default_rng(8)
    other = session(vxi, f'BEGIN PATCH "{tmp_path / "d.vlp"}"')
    width = other.vindex.overlay.widths[2]
    theirs = PatchOp("insert", 2, width, {k: (3.0 * rng.standard_normal(64)).astype(np.float32)
                                          for k in ("gate", "up", "down")}, MetaOverride((70,), (0.5,)), reason="DIFF")
    other.vindex.patches.record(theirs)
    execute("SAVE PATCH", other)
    s = session(vxi)
    vec = {k: (3.0 * rng.standard_normal(64)).astype(np.float32) for k in ("gate", "up", "down")}
    s.vindex.patches.record(PatchOp("insert", 2, width, vec, MetaOverride((71,), (0.5,)), "omega", "colour", "blue",
                                    reason="neuron: x"))
    (res,) = execute(f'MERGE "{tmp_path / "d.vlp"}"', s)
    ((layer, moved, kind, current, incoming, winner),) = res.rows
    assert (layer, moved, kind, winner) == (2, f"{width} -> {width + 1}", "moved", "both")
    assert "omega -[colour]-> blue" in current and incoming.startswith("writes ")
    ov = s.vindex.overlay
    assert list(ov.added(2)) == [width, width + 1]
    assert np.array_equal(ov[(2, width)].down, vec["down"]) and np.array_equal(ov[(2, width + 1)].down, theirs.vectors["down"])
    again = session(vxi)
    again.vindex.patches.record(theirs)
    (res,) = execute(f'MERGE "{tmp_path / "d.vlp"}"', again)
    assert not res.rows and list(again.vindex.overlay.added(2)) == [width]
