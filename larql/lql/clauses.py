"""Optional clauses the grammar accepts (they are LARQL's) but larql does not carry out: refused at
plan time with the reason and what to write instead, never parsed and then ignored.

Every other optional clause changes the plan and the result; tests/unit/lql/test_clauses.py shows
one or the other for each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from larql.lql import ast


@dataclass(frozen=True)
class Refusal:
    applies: Callable[[ast.Statement], bool]
    message: str
    hint: str


def _insert_uses_confidence(s: ast.InsertStmt) -> bool:
    # only LARQL's single-feature INSERT searches a scale until p(target) reaches CONFIDENCE
    return (s.method or "") == "feature" and len(s.rows) == 1 and "prompt" not in s.columns


REFUSALS: dict[type, tuple[Refusal, ...]] = {
    ast.UseStmt: (
        Refusal(lambda s: s.auto_extract,  # type: ignore[attr-defined]
                "USE MODEL ... AUTO_EXTRACT is not supported: USE MODEL runs the model as it is",
                'drop AUTO_EXTRACT, or EXTRACT MODEL "m" INTO "m.vindex" WITH INFERENCE first'),
    ),
    ast.ExtractStmt: (
        Refusal(lambda s: s.components is not None,  # type: ignore[attr-defined]
                "EXTRACT ... COMPONENTS is not supported: every component is extracted",
                "drop COMPONENTS; WITH INFERENCE adds the model weights, without it the vindex is browse-only"),
        Refusal(lambda s: s.layers is not None,  # type: ignore[attr-defined]
                "EXTRACT ... LAYERS is not supported: every layer is extracted",
                "drop LAYERS; queries take LAYERS a-b or AT LAYER n instead"),
    ),
    ast.WalkStmt: (
        Refusal(lambda s: s.mode is not None,  # type: ignore[attr-defined]
                "WALK ... MODE is not supported: WALK scans features with the last token's embedding and "
                "runs no inference, so there is no FFN mode to choose",
                'INFER "..." COMPARE runs the walk FFN beside the dense one'),
        Refusal(lambda s: s.compare,  # type: ignore[attr-defined]
                "WALK ... COMPARE is not supported: WALK runs no inference to compare",
                'INFER "..." COMPARE runs the walk FFN beside the dense one'),
    ),
    ast.InsertStmt: (
        Refusal(lambda s: s.mode == "knn",  # type: ignore[attr-defined]
                "MODE KNN (LARQL's lookup after the logits) is not supported: larql edits the FFN itself, so TRACE "
                "and every later token see the fact", "omit MODE (or say MODE COMPOSE)"),
        Refusal(lambda s: s.alpha is not None,  # type: ignore[attr-defined]
                "INSERT ... ALPHA is not supported: the inserted feature's scale is searched until p(target) "
                "reaches CONFIDENCE, and weight edits optimise their own", "drop ALPHA"),
        Refusal(lambda s: s.confidence is not None and not _insert_uses_confidence(s),  # type: ignore[attr-defined, arg-type]
                "INSERT ... CONFIDENCE applies to METHOD FEATURE with one row only, without a prompt column: "
                "a weight edit optimises until every target token is the top-1 on its prompts",
                "drop CONFIDENCE, or insert one fact with METHOD FEATURE and no prompt"),
    ),
    ast.MergeStmt: (
        Refusal(lambda s: s.into is not None,  # type: ignore[attr-defined]
                "MERGE ... INTO is not supported: MERGE adds to the edits of the vindex in use (vindex files are "
                "never written)", 'USE "target.vindex"; MERGE "src"; then COMPILE CURRENT INTO VINDEX "out.vindex"'),
    ),
    ast.CompactStmt: (
        Refusal(lambda s: s.full,  # type: ignore[attr-defined]
                "COMPACT MAJOR FULL is not supported: COMPACT MAJOR already folds every applied patch and edit",
                "drop FULL / ALL"),
        Refusal(lambda s: s.lambda_ is not None,  # type: ignore[attr-defined]
                "COMPACT ... WITH LAMBDA is not supported: larql's COMPACT folds the patch stack exactly, there is "
                "no ridge solve to regularise", "drop WITH LAMBDA"),
    ),
    ast.ShowRelationsStmt: (
        Refusal(lambda s: s.mode == "raw",  # type: ignore[attr-defined]
                "SHOW RELATIONS ... RAW is not supported: relations are cluster labels, there is no raw form",
                "VERBOSE lists 50 relations, BRIEF (the default) 30"),
    ),
}


def refusal(stmt: ast.Statement) -> Refusal | None:
    """The first clause of `stmt` that larql refuses, or None."""
    return next((r for r in REFUSALS.get(type(stmt), ()) if r.applies(stmt)), None)
