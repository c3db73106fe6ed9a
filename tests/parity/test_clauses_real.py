"""The clauses a tiny model cannot show (its vocabulary has no entities, its features no relation
labels), on the real Gemma 3 270M vindex: DESCRIBE's band, layer, mode and RELATIONS ONLY; SHOW
ENTITIES' layer and limit; SELECT FROM ENTITIES with ORDER BY; SHOW RELATIONS' clauses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from larql.lql.executor import execute
from larql.lql.parser import parse
from larql.lql.planner import plan
from larql.lql.result import Result
from larql.lql.session import Session


@pytest.fixture(scope="module")
def session(gemma_vindex: Path) -> Session:
    s = Session()
    execute(f'USE "{gemma_vindex}"', s)
    return s


def one(session: Session, text: str) -> Result:
    return execute(text, session)[0]


def feature_rows(res: Result) -> list[list[object]]:
    return [r for r in res.rows if r[0] != "probe"]


def test_describe_clauses(session: Session, gemma_vindex: Path) -> None:
    default = one(session, 'DESCRIBE "France"')
    layers = {int(str(r[4]).lstrip("L")) for r in feature_rows(default)}
    assert len(layers) > 1
    at12 = one(session, 'DESCRIBE "France" AT LAYER 12')
    assert {str(r[4]) for r in feature_rows(at12)} <= {"L12"} and len(feature_rows(at12)) < len(feature_rows(default))
    bands = session.vindex.index["layer_bands"]  # type: ignore[union-attr]
    for band in ("syntax", "knowledge", "output"):
        got = one(session, f'DESCRIBE "France" {band.upper()}')
        lo, hi = bands[band]
        assert all(lo <= int(str(r[4]).lstrip("L")) <= hi for r in feature_rows(got))
    # the default, said out loud (probe scores within float rounding: a repeated DESCRIBE reuses the
    # probes' cached prompt prefixes, a different but equal-up-to-1e-7 summation order)
    said = one(session, 'DESCRIBE "France" ALL LAYERS').rows
    assert len(said) == len(default.rows)
    for a, b in zip(said, default.rows):
        real = [isinstance(x, (float, np.floating)) for x in a]
        assert [x for x, r in zip(a, real) if not r] == [x for x, r in zip(b, real) if not r]
        assert [float(x) for x, r in zip(a, real) if r] == pytest.approx([float(x) for x, r in zip(b, real) if r], rel=1e-6)
    verbose = one(session, 'DESCRIBE "France" VERBOSE')
    assert verbose.columns[-1] == "also" and default.columns[-1] == "layers"
    related = one(session, 'DESCRIBE "France" RELATIONS ONLY')
    assert 0 < len(feature_rows(related)) < len(feature_rows(default))
    # RAW lifts BRIEF's per-band caps (10/10/5); France has fewer edges than that, so only the plan shows it
    assert "mode=raw" in plan(parse('DESCRIBE "France" RAW')[0], session).to_text()


def test_entities_and_relations_clauses(session: Session) -> None:
    everywhere = one(session, "SHOW ENTITIES LIMIT 5")
    at12 = one(session, "SHOW ENTITIES AT LAYER 12 LIMIT 5")
    assert len(everywhere.rows) == len(at12.rows) == 5 and everywhere.rows != at12.rows
    assert one(session, "SHOW ENTITIES 12 LIMIT 5").rows == at12.rows  # the bare layer form
    asc = one(session, "SELECT token, count FROM ENTITIES ORDER BY count ASC LIMIT 5")
    desc = one(session, "SELECT token, count FROM ENTITIES ORDER BY count DESC LIMIT 5")
    assert asc.columns == ["token", "count"] and max(r[1] for r in asc.rows) < min(r[1] for r in desc.rows)
    brief, verbose = one(session, "SHOW RELATIONS"), one(session, "SHOW RELATIONS VERBOSE")
    assert len(brief.rows) == 30 and len(verbose.rows) == 50 and verbose.rows[:30] == brief.rows
    assert one(session, "SHOW RELATIONS WITH EXAMPLES").columns == ["relation", "features", "examples"]
    at12 = one(session, "SHOW RELATIONS AT LAYER 12")
    assert sum(r[1] for r in at12.rows) < sum(r[1] for r in brief.rows)
