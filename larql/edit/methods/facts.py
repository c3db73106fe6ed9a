"""Facts to edit and the prompts an edit is optimised on.

A `Fact` is a CounterFact-style request: a subject, a prompt that contains it ("The capital of
France is"), the new target ("Rome"), and optionally the true target, the relation's name and the
user's own extra prompts. Weight edits key on the subject's LAST token, so every prompt must
contain the subject; they are optimised on the prompt behind short prefixes that the model writes
itself (ROME's context templates: in-distribution text, nothing shipped or downloaded) so that the
edit does not depend on what comes before the subject.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from larql.edit.methods.defaults import is_key_of
from larql.errors import EditError

if TYPE_CHECKING:
    from larql.model.model import Model

# Seeds for the model-written prefixes (MEMIT's). The optimisation uses PREFIX_SEED, the evaluation
# (edit/measure/evaluate.py) a different seed, so that it scores contexts the edit never saw.
PREFIX_SEEDS = ("The", "Therefore", "Because", "I", "You")
PREFIX_SEED = 0


@dataclass(frozen=True)
class Fact:
    """One edit: `prompt` contains `subject`, the model should continue it with `target`."""

    subject: str
    prompt: str
    target: str
    relation: str = ""
    target_true: str | None = None
    prompts: tuple[str, ...] = field(default=())  # the user's extra prompts to optimise on
    key: str | None = None  # the subject's leading words an edit keys on (`defaults.subject_keys`); None: all of it

    def __post_init__(self) -> None:
        for name in ("subject", "prompt", "target"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise EditError(f"an edit needs a non-empty {name} (got {value!r})")
        for p in (self.prompt, *self.prompts):
            if self.subject not in p:
                raise EditError(f"the subject {self.subject!r} does not occur in the prompt {p!r}; weight edits "
                                f"key on the subject's last token, so every prompt must contain it")
        if self.key is not None and not is_key_of(self.key, self.subject):
            raise EditError(f"the key {self.key!r} is not the leading words of the subject {self.subject!r}")

    @property
    def keyed(self) -> str:
        """What the edit keys on: `key`, or the whole subject."""
        return self.key or self.subject

    @property
    def label(self) -> str:
        rel = f"-[{self.relation}]-> " if self.relation else "-> "
        return f"{self.subject} {rel}{self.target}"


_RELATION_FIRST = re.compile(r"^(?:The|the) (?P<noun>[\w' -]+?) of (?P<subject>.+?) (?P<verb>is|was|are|were)(?P<rest>( [\w' -]+)?)$")


def rewrites(prompt: str, subject: str) -> list[str]:
    """The fact's prompt asked in other words that the value step also optimises on, where the prompt
    reads "The <noun> of <subject> is": the subject first ("Japan's capital is") and a question
    ("Q: What is the capital of Japan? A:"). A value optimised only with the relation before the
    subject learns to answer only there: at the subject's token later layers have read the relation,
    and in "Japan's capital city is" they have not."""
    m = _RELATION_FIRST.match(prompt.strip())
    if m is None or m.group("subject") != subject:
        return []
    noun, verb, rest = m.group("noun"), m.group("verb"), m.group("rest")
    answer = f" {rest.strip()[:1].upper()}{rest.strip()[1:]}" if rest else ""  # "A: The city of"
    return [f"{subject}'s {noun} {verb}{rest}", f"Q: What {verb} the {noun} of {subject}? A:{answer}"]


_prefix_cache: weakref.WeakKeyDictionary[Model, dict[tuple[int, int], tuple[str, ...]]] = weakref.WeakKeyDictionary()


def model_prefixes(model: Model, n: int = 10, seed: int = PREFIX_SEED) -> tuple[str, ...]:
    """`n` short texts the model writes itself from MEMIT's seed words (top-5 sampling, seeded), half
    about 5 tokens long and half about 10, each ending in ". " ready for a prompt to follow."""
    per_model = _prefix_cache.setdefault(model, {})
    key = (n, seed)
    if key in per_model:
        return per_model[key]
    rng = np.random.default_rng(seed)
    out = []
    for j in range(n):
        start = PREFIX_SEEDS[j % len(PREFIX_SEEDS)]
        length = 4 if j < n // 2 else 9
        gen = model.generate(start, max_new_tokens=length, temperature=1.0, top_k=5,
                             seed=int(rng.integers(1 << 31)), stop_at_eos=True)
        text = (start + gen.text).replace("{", " ").replace("}", " ").replace("\n", " ").strip()
        out.append(text.rstrip(".") + ". ")
    per_model[key] = tuple(out)
    return per_model[key]
