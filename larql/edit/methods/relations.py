"""A subject's other relations: what an edit of one relation must leave as it was, and the check.

An edit keyed on its subject (a neuron, ROME, MEMIT) writes one value wherever the subject is read,
so a new capital also moved the subject's language and continent. The value step holds them
(`relation_holds`): for each subject, DESCRIBE's relation templates (vindex/probes.py), asked bare
("The official language of France is"), keep their unedited answer, except the relation being
edited — a template the fact's relation names, or one whose unedited answer is the one the fact's
own prompt gets. INSERT's report reads the subject's known relations (DESCRIBE's probe edges) before
and after the edit (`known_relations`, `recheck`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from larql.edit.methods.facts import Fact, rewrites
from larql.model.model import Model
from larql.vindex.probes import (
    MAX_ANSWER_TOKENS,
    TEMPLATES,
    RelationTemplate,
    probe_answers,
    probe_edges_many,
    probe_prompt,
)
from larql.vindex.tokens import Edge


def known_edges(model: Model, subjects: Sequence[str]) -> list[list[Edge]]:
    """DESCRIBE's probe edges of each subject (the answers that clear its bar), every subject's probes
    batched together; a template whose few-shot prompt does not fit the model's context is skipped."""
    out: list[list[Edge]] = [[] for _ in subjects]
    by_fit: dict[tuple[RelationTemplate, ...], list[int]] = {}
    for i, subject in enumerate(subjects):
        fits = tuple(t for t in TEMPLATES if len(model.tokenize(probe_prompt(t, subject))) + MAX_ANSWER_TOKENS
                     <= model.config.context_length)
        if fits:
            by_fit.setdefault(fits, []).append(i)
    for fits, idx in by_fit.items():
        for i, edges in zip(idx, probe_edges_many(model, [subjects[i] for i in idx], fits)):
            out[i] = edges
    return out


def _top1(model: Model, prompts: Sequence[str]) -> list[int]:
    if not prompts:
        return []
    logits = model.next_logits_batch([model.tokenize(p) for p in prompts])  # (n, vocab)
    return [int(np.argmax(row)) for row in logits]


def _by_subject(facts: Sequence[Fact]) -> dict[str, list[Fact]]:
    out: dict[str, list[Fact]] = {}
    for f in facts:
        out.setdefault(f.subject, []).append(f)
    return out


def _edited(relation: str, facts: Sequence[Fact]) -> bool:
    return any(f.relation and f.relation.lower() == relation.lower() for f in facts)


def relation_holds(model: Model, facts: Sequence[Fact]) -> dict[str, list[str]]:
    """Per subject of `facts`, the prompts about its other relations whose answers its edit holds."""
    by_subject = _by_subject(facts)
    asked = [(s, t.template.format(s)) for s, group in by_subject.items() for t in TEMPLATES
             if not _edited(t.relation, group)
             and len(model.tokenize(t.template.format(s))) < model.config.context_length // 2]
    own = [(s, f.prompt) for s, group in by_subject.items() for f in group]
    tops = _top1(model, [p for _, p in asked] + [p for _, p in own])
    edited: dict[str, set[int]] = {}
    for (s, _), t in zip(own, tops[len(asked):]):
        edited.setdefault(s, set()).add(t)
    out: dict[str, list[str]] = {}
    for (s, prompt), t in zip(asked, tops):
        if t not in edited[s]:  # the same answer as the edited prompt: the same relation, asked otherwise
            out.setdefault(s, []).extend([prompt, *rewrites(prompt, s)])
    return out


@dataclass(frozen=True)
class RelationCheck:
    """One of a subject's other relations, as DESCRIBE's probe answers it before and after an edit."""

    subject: str
    relation: str
    before: str
    p_before: float  # probability of the answer's first token
    after: str = ""
    p_after: float = 0.0

    @property
    def kept(self) -> bool:
        return self.before.lower() == self.after.lower()


def known_relations(model: Model, facts: Sequence[Fact], edges: Sequence[Sequence[Edge]] | None = None,
                    ) -> list[RelationCheck]:
    """The relations each subject of `facts` is known for (probe edges that clear DESCRIBE's bar;
    `edges`: `known_edges` of the subjects in order of first mention, read before), less the edited
    ones (by name, or answered with the fact's old or new object)."""
    by_subject = _by_subject(facts)
    subjects = list(by_subject)
    out = []
    for subject, edges_of in zip(subjects, known_edges(model, subjects) if edges is None else edges):
        group = by_subject[subject]
        objects = {o.strip().lower() for f in group for o in (f.target, f.target_true or "") if o.strip()}
        out += [RelationCheck(subject, e.label or "", e.target, e.score) for e in edges_of
                if e.label and not _edited(e.label, group) and e.target.strip().lower() not in objects]
    return out


def recheck(model: Model, known: Sequence[RelationCheck]) -> list[RelationCheck]:
    """`known` with each relation's answer read again from `model` (the edited one)."""
    templates = {t.relation: t for t in TEMPLATES}
    pairs: list[tuple[RelationTemplate, str]] = [(templates[c.relation], c.subject) for c in known]
    return [RelationCheck(c.subject, c.relation, c.before, c.p_before, answer, p)
            for c, (answer, p) in zip(known, probe_answers(model, pairs))]
