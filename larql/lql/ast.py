"""LQL statements as frozen dataclasses, one per statement kind; every node carries its source span.

Spans do not take part in equality, so `parse(unparse(s)) == s` compares meaning, not layout.
Option fields are None when the clause was not given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Span:
    line: int
    column: int
    end_line: int
    end_column: int
    start: int  # character offsets into the source text
    end: int


NO_SPAN = Span(0, 0, 0, 0, 0, 0)


def _span() -> Span:
    return field(default=NO_SPAN, compare=False, repr=False)


@dataclass(frozen=True)
class Range:
    start: int
    end: int


Value = str | int | float | tuple  # a tuple holds an IN list


@dataclass(frozen=True)
class Condition:
    field: str
    op: str  # = != < > <= >= LIKE IN
    value: Value


@dataclass(frozen=True)
class OrderBy:
    field: str
    descending: bool = False


@dataclass(frozen=True)
class Assignment:
    field: str
    value: Value


@dataclass(frozen=True)
class Nearest:
    entity: str
    layer: int


class Statement:
    """Base of every statement node."""

    span: Span
    # every statement is a frozen dataclass (dataclasses.replace() works on any); for the type checker
    __dataclass_fields__: ClassVar[dict[str, Any]]


@dataclass(frozen=True)
class ExtractStmt(Statement):
    model: str
    into: str
    components: tuple[str, ...] | None = None
    layers: Range | None = None
    level: str = "browse"  # browse | inference | all
    force: bool = False  # FORCE: may extract over an existing directory
    span: Span = _span()


@dataclass(frozen=True)
class CompileStmt(Statement):
    source: str | None  # None: CURRENT
    target: str  # model | vindex
    into: str
    format: str | None = None  # safetensors | gguf (INTO MODEL)
    on_conflict: str | None = None  # last_wins | highest_confidence | fail (INTO VINDEX)
    force: bool = False  # FORCE: may replace an existing output
    dtype: str | None = None  # f32 | f16 | bf16: the safetensors' encoding (INTO MODEL; None: bf16)
    span: Span = _span()


@dataclass(frozen=True)
class DiffStmt(Statement):
    a: str | None  # None: CURRENT
    b: str | None
    layer: int | None = None
    relation: str | None = None
    limit: int | None = None
    into_patch: str | None = None
    force: bool = False  # INTO PATCH ... FORCE: may replace an existing file
    span: Span = _span()


@dataclass(frozen=True)
class UseStmt(Statement):
    kind: str  # vindex | model | remote
    target: str
    auto_extract: bool = False
    span: Span = _span()


@dataclass(frozen=True)
class UseSaeStmt(Statement):
    """USE SAE "dir" [AT LAYER n] [LABELS "file"]: attach an SAE (SAELens' format) at the hook point its
    cfg.json names; AT LAYER checks that hook point's layer; LABELS reads its features' explanations."""

    path: str
    layer: int | None = None
    labels: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class SaeFeaturesStmt(Statement):
    """FEATURES "prompt" [AT LAYER n] [TOP k] [POSITIONS {LAST | ALL}]: the attached SAEs' strongest
    features at each position of the prompt (AT LAYER: the SAE at that layer only)."""

    prompt: str
    layer: int | None = None
    top: int | None = None
    positions: str | None = None  # last | all (None: all)
    span: Span = _span()


@dataclass(frozen=True)
class SaeFeatureStmt(Statement):
    """SAE ["sae"] FEATURE n [TOP k]: where one feature fires most in larql's statistics corpus (the
    SAE by its USE SAE path or hook point; None: the one attached)."""

    sae: str | None
    feature: int
    top: int | None = None
    span: Span = _span()


@dataclass(frozen=True)
class ShowSaesStmt(Statement):
    span: Span = _span()


@dataclass(frozen=True)
class DropSaeStmt(Statement):
    """DROP SAE "dir-or-hook" detaches one SAE; DROP SAES (target None) detaches them all."""

    target: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class WalkStmt(Statement):
    prompt: str
    top: int | None = None
    layers: Range | str | None = None  # a Range, or "all"
    mode: str | None = None  # hybrid | pure | dense
    compare: bool = False
    span: Span = _span()


@dataclass(frozen=True)
class DescribeStmt(Statement):
    entity: str
    band: str | None = None  # all | syntax | knowledge | output
    at_layer: int | None = None
    relations_only: bool = False
    mode: str | None = None  # brief | verbose | raw
    span: Span = _span()


@dataclass(frozen=True)
class SelectStmt(Statement):
    fields: tuple[str, ...]  # () means *
    source: str  # edges | features | entities
    nearest: Nearest | None = None
    where: tuple[Condition, ...] = ()
    order: OrderBy | None = None
    limit: int | None = None
    span: Span = _span()


@dataclass(frozen=True)
class ExplainWalkStmt(Statement):
    prompt: str
    layers: Range | None = None
    verbose: bool = False
    top: int | None = None
    band: str | None = None
    relations_only: bool = False
    span: Span = _span()


@dataclass(frozen=True)
class Steer:
    """STEER ["sae"] FEATURE n BY x: the SAE (its USE SAE path or hook point; None: the one attached)."""

    sae: str | None
    feature: int
    scale: float


@dataclass(frozen=True)
class InferStmt(Statement):
    prompt: str
    top: int | None = None
    compare: bool = False
    steer: Steer | None = None
    span: Span = _span()


@dataclass(frozen=True)
class ExplainInferStmt(Statement):
    prompt: str
    layers: Range | None = None
    verbose: bool = False
    top: int | None = None
    band: str | None = None
    relations_only: bool = False
    with_attention: bool = False
    span: Span = _span()


@dataclass(frozen=True)
class TraceStmt(Statement):
    prompt: str
    for_token: str | None = None
    decompose: bool = False
    layers: Range | None = None
    positions: str | None = None  # last | all
    save: str | None = None
    force: bool = False  # SAVE ... FORCE: may replace an existing file
    span: Span = _span()


INSERT_COLUMNS = ("entity", "relation", "target", "prompt", "key")


@dataclass(frozen=True)
class InsertStmt(Statement):
    """INSERT INTO EDGES (columns) VALUES (row), (row)...: columns are entity, relation and target
    (required, LARQL's), prompt (optional: the user's own prompt for the fact) and key (optional, METHOD
    NEURON: the entity's leading words its neuron keys on, instead of `defaults.subject_keys`' choice)."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    layer: int | None = None
    confidence: float | None = None
    alpha: float | None = None
    mode: str | None = None  # knn | compose
    method: str | None = None  # rome | memit | feature; None: the default
    layers: Range | None = None  # LAYERS a-b: a weight edit spread over these layers (MEMIT's)
    span: Span = _span()

    def values(self, row: int = 0) -> dict[str, str]:
        return dict(zip(self.columns, self.rows[row]))

    @property
    def entity(self) -> str:
        return self.values()["entity"]

    @property
    def relation(self) -> str:
        return self.values()["relation"]

    @property
    def target(self) -> str:
        return self.values()["target"]


@dataclass(frozen=True)
class CrownStmt(Statement):
    """CROWN "prompt" FOR "expected" [SUBJECT "subject"]: which layer's MLP carries the fact."""

    prompt: str
    expected: str
    subject: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class DeleteStmt(Statement):
    where: tuple[Condition, ...]
    span: Span = _span()


@dataclass(frozen=True)
class UpdateStmt(Statement):
    assignments: tuple[Assignment, ...]
    where: tuple[Condition, ...]
    span: Span = _span()


@dataclass(frozen=True)
class MergeStmt(Statement):
    source: str
    into: str | None = None
    on_conflict: str | None = None  # last_wins | keep_current | highest_confidence | fail
    span: Span = _span()


@dataclass(frozen=True)
class RebalanceStmt(Statement):
    until_converged: bool = False
    max_iters: int | None = None
    floor: float | None = None
    ceiling: float | None = None
    layer: int | None = None  # AT LAYER n; None: every layer holding feature inserts
    span: Span = _span()


@dataclass(frozen=True)
class CompactStmt(Statement):
    level: str  # minor | major
    full: bool = False
    lambda_: float | None = None
    span: Span = _span()


@dataclass(frozen=True)
class BeginPatchStmt(Statement):
    path: str
    force: bool = False  # FORCE: SAVE PATCH may replace an existing file
    span: Span = _span()


@dataclass(frozen=True)
class SavePatchStmt(Statement):
    force: bool = False  # FORCE: may replace an existing file
    span: Span = _span()


@dataclass(frozen=True)
class ApplyPatchStmt(Statement):
    path: str
    span: Span = _span()


@dataclass(frozen=True)
class ShowPatchesStmt(Statement):
    span: Span = _span()


@dataclass(frozen=True)
class RemovePatchStmt(Statement):
    path: str
    span: Span = _span()


@dataclass(frozen=True)
class ShowRelationsStmt(Statement):
    layer: int | None = None
    with_examples: bool = False
    mode: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class ShowLayersStmt(Statement):
    range: Range | None = None
    span: Span = _span()


@dataclass(frozen=True)
class ShowFeaturesStmt(Statement):
    layer: int
    where: tuple[Condition, ...] = ()
    limit: int | None = None
    span: Span = _span()


@dataclass(frozen=True)
class ShowEntitiesStmt(Statement):
    layer: int | None = None
    limit: int | None = None
    span: Span = _span()


@dataclass(frozen=True)
class ShowModelsStmt(Statement):
    span: Span = _span()


@dataclass(frozen=True)
class ShowCompactStatusStmt(Statement):
    span: Span = _span()


@dataclass(frozen=True)
class StatsStmt(Statement):
    path: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class PipeStmt(Statement):
    stages: tuple[Statement, ...]
    span: Span = _span()
