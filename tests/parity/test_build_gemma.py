"""`larql build` on Gemma 3 270M (FROM the session's extracted vindex, so nothing is extracted
again): a DELETE, a LABELS file whose label DESCRIBE then shows, and EXPOSE browse."""

from __future__ import annotations

import json
from pathlib import Path

from larql.lql.executor import execute
from larql.vindex.describe import describe
from larql.vindex.store import open_vindex
from larql.vindexfile.run import build


def test_build_on_gemma_labels_show_in_describe(gemma_vindex: Path, tmp_path: Path) -> None:
    edge = next(e for e in describe(open_vindex(gemma_vindex), "France").edges if e.source == "feature")
    (tmp_path / "labels.json").write_text(json.dumps([{"layer": edge.layer, "feature": edge.feature,
                                                       "label": "hand-label"}]))
    (tmp_path / "Vindexfile").write_text(f'FROM "{gemma_vindex}"\nDELETE layer = 3 AND feature = 5\n'
                                         "LABELS labels.json\nEXPOSE browse\n")
    report = build(tmp_path, tmp_path / "out.vindex")
    assert [r.step.name for r in report.ran] == ["DELETE", "COMPILE", "LABELS", "EXPOSE"]
    out = open_vindex(tmp_path / "out.vindex")
    assert not out.has_model_weights and "weights.bin" not in out.index["files"]
    assert not out.down_meta(3)[0][5].any()
    rows = execute(f'USE "{out.path}"; DESCRIBE "France" VERBOSE;')[-1].rows
    assert any(r[1] == "hand-label" and r[2] == edge.target for r in rows), rows
    assert build(tmp_path, tmp_path / "again.vindex").ran == []
