"""Vindexfile parsing: every instruction, stages, comments, and errors that name the line."""

from __future__ import annotations

import pytest

from larql.errors import BuildError
from larql.lql import ast
from larql.vindexfile.parse import parse_vindexfile

GOOD = '''# a recipe
FROM "base dir/g.vindex"   # quoted: a path with a space
patch facts.vlp
INSERT ("France", "capital", "Rome")
INSERT INTO EDGES (entity, relation, target) \\
  VALUES ("Peru", "language", "French") METHOD MEMIT
DELETE entity = "Paris#1" AND relation = "capital"
STAGE dev
LABELS "labels.json"
STAGE prod
EXPOSE browse inference
'''


def test_every_instruction_parses() -> None:
    vf = parse_vindexfile(GOOD)
    got = [(i.line, i.keyword, i.arg, i.stage) for i in vf.instructions]
    assert got == [
        (2, "FROM", "base dir/g.vindex", None),
        (3, "PATCH", "facts.vlp", None),
        (4, "INSERT", 'INTO EDGES (entity, relation, target) VALUES ("France", "capital", "Rome")', None),
        (5, "INSERT", 'INTO EDGES (entity, relation, target) VALUES ("Peru", "language", "French") METHOD MEMIT', None),
        (7, "DELETE", 'FROM EDGES WHERE entity = "Paris#1" AND relation = "capital"', None),
        (8, "STAGE", "dev", "dev"),
        (9, "LABELS", "labels.json", "dev"),
        (10, "STAGE", "prod", "prod"),
        (11, "EXPOSE", "inference", "prod"),  # LARQL lists levels: the largest is kept
    ]
    assert isinstance(vf.instructions[2].statement, ast.InsertStmt)
    assert vf.instructions[3].statement.method == "memit"  # type: ignore[union-attr]
    assert isinstance(vf.instructions[4].statement, ast.DeleteStmt)


def test_a_stage_selects_everything_up_to_its_end() -> None:
    vf = parse_vindexfile(GOOD)
    assert vf.stages == ("dev", "prod")
    assert [i.line for i in vf.select("dev")] == [2, 3, 4, 5, 7, 8, 9]
    assert len(vf.select(None)) == 9
    with pytest.raises(BuildError, match=r"no STAGE 'qa' \(stages: dev, prod\)"):
        vf.select("qa")


@pytest.mark.parametrize(("text", "message"), [
    ("FROM g.vindex\nPACH x.vlp", 'Vindexfile:2: unknown instruction "PACH"; did you mean PATCH?'),
    ("FROM g.vindex\nfrobnicate", 'Vindexfile:2: unknown instruction "frobnicate" (instructions: FROM, PATCH'),
    ("# c\n\nPATCH x.vlp", "Vindexfile:3: PATCH before FROM"),
    ("FROM a\nFROM b", "Vindexfile:2: FROM must be the first instruction, and there is only one"),
    ("FROM a\nPATCH", 'Vindexfile:2: PATCH needs a path, e.g. PATCH "facts.vlp"'),
    ("FROM a\nLABELS two words.json", 'Vindexfile:2: LABELS takes one path; quote a path with spaces'),
    ("FROM a\nPATCH \"x.vlp", "Vindexfile:2: PATCH: unterminated quoted path"),
    ("FROM a\nEXPOSE brwose", 'Vindexfile:2: unknown EXPOSE level "brwose"; did you mean browse?'),
    ("FROM a\nEXPOSE", "Vindexfile:2: EXPOSE needs a level: browse | inference | all"),
    ("FROM a\nINSERT (\"a\", \"b\")", "Vindexfile:2: INSERT: "),
    ("FROM a\nDELETE WHERE", "Vindexfile:2: DELETE: "),
    ("FROM a\nINSERT DESCRIBE \"x\"", "Vindexfile:2: INSERT: "),
    ("FROM a\nSTAGE x\nSTAGE x", "Vindexfile:3: STAGE x is defined twice"),
    ("FROM a\nSTAGE two words", "Vindexfile:2: STAGE needs a name"),
    ("# only a comment\n", "Vindexfile: empty; a Vindexfile starts with FROM"),
])
def test_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(BuildError) as e:
        parse_vindexfile(text)
    assert message in str(e.value)
    assert "\n" not in str(e.value)  # one line
