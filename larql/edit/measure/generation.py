"""Scoring an edit by the model's own greedy continuation, no teacher forcing (the "WILD" protocol):
a prompt counts when its continuation names the new target and no longer the old object.

Teacher-forced scores (ES / PS) ask whether the new target is likelier than the old one when both
are handed to the model; a model that prefers the target by a hair may still never say it. Here the
model writes WILD_TOKENS tokens greedily after each prompt and the text is read for the words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from larql.model.attention import KVCache
from larql.model.model import Model

WILD_TOKENS = 10  # new tokens per continuation: room for a multi-token answer after a short lead-in
# continuations stepped together (each step returns only their top-1s, no logit rows): a step of more
# rows runs each weight matrix's dequantization once for all of them (256 against 64: 15-20% faster)
BATCH = 256


def greedy_ids(model: Model, prompts: Sequence[str], max_new_tokens: int = WILD_TOKENS,
               batch: int = BATCH) -> list[list[int]]:
    """Each prompt's greedy continuation as token ids (up to `max_new_tokens`; an EOS ends it and is
    kept, as `Model.generate_batch` keeps it), `batch` prompts stepped together through
    `Model.next_top1_batch` (the exact argmax)."""
    out: list[list[int]] = []
    for at in range(0, len(prompts), batch):
        ids = [model.tokenize(p) for p in prompts[at: at + batch]]
        out += continue_greedily(model, ids, [model.new_cache(len(p) + max_new_tokens) for p in ids],
                                 [[] for _ in ids], max_new_tokens)
    return out


def continue_greedily(model: Model, feed: list[list[int]], caches: list[KVCache], new: list[list[int]],
                      max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations stepped together: sequence b runs `feed[b]` after what `caches[b]` holds,
    its tokens chosen so far being `new[b]` (whose last is `feed[b]` where there is one), until it has
    `max_new_tokens` of them or an EOS. Returns `new`, extended."""
    eos = set(model.tokenizer.eos_ids)

    def going(b: int) -> bool:
        return len(new[b]) < max_new_tokens and not (new[b] and new[b][-1] in eos)

    running = [b for b in range(len(new)) if going(b)]
    feed = [feed[b] for b in running]
    while running:
        tops, _ = model.next_top1_batch(feed, [caches[b] for b in running])
        for b, tok in zip(running, tops):
            new[b].append(int(tok))
        running = [b for b in running if going(b)]
        feed = [[new[b][-1]] for b in running]
    return new


def continuation_text(model: Model, ids: Sequence[int]) -> str:
    """The text of a continuation's ids, its EOS left out."""
    eos = set(model.tokenizer.eos_ids)
    return model.detokenize([t for t in ids if t not in eos])


def greedy_continuations(model: Model, prompts: Sequence[str], max_new_tokens: int = WILD_TOKENS,
                         batch: int = BATCH) -> list[str]:
    """Each prompt's greedy continuation (text of up to `max_new_tokens` new tokens; an EOS ends it)."""
    return [continuation_text(model, ids) for ids in greedy_ids(model, prompts, max_new_tokens, batch)]


@lru_cache(maxsize=4096)
def _word(target: str) -> re.Pattern[str]:
    """`target` as a whole word (or phrase), any case: "Rome" is not found in "Romeo"."""
    return re.compile(r"(?<!\w)" + re.escape(target.strip()) + r"(?!\w)", re.IGNORECASE)


def names(text: str, target: str) -> bool:
    return bool(target.strip()) and _word(target).search(text) is not None


def wild_hit(text: str, target_new: str, target_true: str | None) -> float:
    """1 if the continuation names the new target and not the old object (when there is one)."""
    return float(names(text, target_new) and not (target_true is not None and names(text, target_true)))
