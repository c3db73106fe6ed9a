"""Plans as values, and the cursor a handler runs one through.

A `Step` carries the parameters its handler reads (`params`: layers, top-k, thresholds, paths,
methods...) beside the text EXPLAIN / `--plan` prints (`detail`). The planner writes both from the
same values. Handlers never re-derive a default: they `take` each step in order and read its
parameters, so a plan with a changed parameter runs differently, and a step a handler skips or
invents is an error, not a silent drift (the executor checks every step was taken).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from larql.errors import LarqlError
from larql.lql import ast
from larql.lql.unparse import unparse


class PlanDriftError(LarqlError):
    """A handler took a step its plan does not have, or left one of the plan's steps untaken."""


@dataclass(frozen=True)
class Step:
    op: str
    detail: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)  # what the handler reads; EXPLAIN shows `detail`

    def __getitem__(self, key: str) -> Any:
        return self.params[key]

    def line(self) -> str:
        return self.op + (f"  {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class Plan:
    statement: ast.Statement
    steps: tuple[Step, ...]

    def to_text(self) -> str:
        lines = [f"PLAN {unparse(self.statement)}"]
        lines += [f"  {i}. {s.line()}" for i, s in enumerate(self.steps, 1)]
        return "\n".join(lines)

    def with_params(self, op: str, **params: Any) -> Plan:
        """This plan with the first `op` step's parameters changed (what a test or a tool rewrites)."""
        i = next((i for i, s in enumerate(self.steps) if s.op == op), None)
        if i is None:
            raise PlanDriftError(f"the plan has no {op} step (it has {', '.join(s.op for s in self.steps)})")
        step = self.steps[i]
        steps = list(self.steps)
        steps[i] = replace(step, params={**step.params, **params})
        return replace(self, steps=tuple(steps))


class PlanRun:
    """The plan being run: its steps taken in order, each handing its parameters to the handler."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.taken: list[Step] = []

    @property
    def _next(self) -> Step | None:
        i = len(self.taken)
        return self.plan.steps[i] if i < len(self.plan.steps) else None

    @property
    def current(self) -> Step | None:
        """The step running now (the last one taken), which an error is blamed on."""
        return self.taken[-1] if self.taken else None

    def take(self, op: str) -> Step:
        """Enter the next step, which must be `op`; returns it, for its parameters."""
        step = self._next
        if step is None or step.op != op:
            raise PlanDriftError(f"the handler ran step {op!r} where the plan has "
                                 f"{repr(step.op) if step else 'no more steps'}; the plan and the handler disagree")
        self.taken.append(step)
        return step

    def take_if(self, op: str) -> Step | None:
        """Enter the next step if it is `op` (an optional step: the plan decides whether it runs)."""
        step = self._next
        return self.take(op) if step is not None and step.op == op else None

    def peek(self, op: str) -> Step | None:
        """A later step's parameters, before it is taken (FORCE: the write needs to know it may replace)."""
        return next((s for s in self.plan.steps[len(self.taken):] if s.op == op), None)

    def param(self, op: str, key: str) -> Any:
        """A parameter of the plan's first `op` step, taken or not (a handler choosing its path)."""
        step = next((s for s in self.plan.steps if s.op == op), None)
        if step is None:
            raise PlanDriftError(f"the handler needs step {op!r}, which the plan does not have")
        return step[key]

    def finish(self) -> None:
        left = self.plan.steps[len(self.taken):]
        if left:
            raise PlanDriftError(f"the handler finished without running step(s) {', '.join(s.op for s in left)} "
                                 "of its plan")
