"""Where targets and subjects are in token ids: the tokens a target is scored by, and the subject's
last token in a prompt (where ROME, MEMIT, NEURON and crown discovery act)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from larql.errors import EditError, EmptyTargetError

__all__ = ["HasTokenizer", "first_target_token", "subject_position", "target_ids", "target_token_ids"]

if TYPE_CHECKING:
    from larql.model.tokenizer import TextTokenizer


class HasTokenizer(Protocol):
    """A Model, or a vindex (store or editable view): anything carrying a TextTokenizer."""

    @property
    def tokenizer(self) -> TextTokenizer: ...


def target_token_ids(m: HasTokenizer, target: str) -> list[int]:
    """Every sub-token of " " + target (as it reads after a prompt; unchanged if it already starts
    with a space), no BOS. Raises EmptyTargetError when there is none."""
    text = target if target.startswith(" ") else " " + target
    ids = [int(i) for i in m.tokenizer.tok.encode(text, add_special_tokens=False).ids]
    if not ids:
        raise EmptyTargetError(f"target {target!r} tokenizes to nothing")
    return ids


def first_target_token(m: HasTokenizer, target: str) -> int:
    """LARQL's rule for a target token: the first sub-token of " " + target."""
    return target_token_ids(m, target)[0]


def subject_position(model: HasTokenizer, text: str, subject: str, key: str | None = None) -> tuple[list[int], int]:
    """(token ids of `text` with BOS, index of the subject's last token — of `key`'s, its leading
    words, when given) — the subject's first occurrence in `text`, located through the tokenizer's
    character offsets."""
    begin = text.find(subject)
    if begin < 0:
        raise EditError(f"the subject {subject!r} does not occur in {text!r}")
    end = begin + len(key or subject)
    enc = model.tokenizer.tok.encode(text, add_special_tokens=True)
    last = None
    for i, (a, b) in enumerate(enc.offsets):
        if b > a and a < end and b > begin:
            last = i
    if last is None:
        raise EditError(f"the subject {subject!r} has no token of its own in {text!r}")
    return [int(i) for i in enc.ids], last


def target_ids(model: HasTokenizer, target: str) -> list[int]:
    """Every token of " " + target (the whole target is taught and scored, not only its first token)."""
    try:
        return target_token_ids(model, target)
    except EmptyTargetError:
        raise EditError(f"the target {target!r} tokenizes to nothing; give a target with visible text") from None
