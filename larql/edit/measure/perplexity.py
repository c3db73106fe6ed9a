"""Perplexity on a held-out text: general capability before and after edits.

The default text (`data/held_out.txt`) is the introduction and first chapter of Jacob A. Riis, "How
the Other Half Lives" (1890; public domain, Project Gutenberg eBook #45502), footnotes and
illustration captions removed: prose no edit set, probe or key statistic reads (the statistics
corpus is model-written text, larql's own text and CPython's reference prose: edit/methods/stats.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from larql.edit.measure.scoring import nll
from larql.errors import EditError
from larql.model.model import Model

HELD_OUT = Path(__file__).with_name("data") / "held_out.txt"
WINDOW = 512  # tokens of context per window (BOS included): the text is scored in windows this long
PIECE = 128  # logit rows per pass (each a vocabulary of float32: 1 MB on gemma3-270m)


def held_out_text(path: str | Path | None = None) -> str:
    """The held-out text (`path`, or the shipped public-domain passage)."""
    p = Path(path) if path is not None else HELD_OUT
    try:
        return p.read_text(encoding="utf-8")
    except OSError as e:
        raise EditError(f"{p}: cannot read the held-out text ({e.strerror or e})") from None


@dataclass(frozen=True)
class Perplexity:
    nll: float  # mean negative log-likelihood per scored token (nats)
    tokens: int  # tokens scored

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


def windows(model: Model, text: str, window: int = WINDOW) -> list[list[int]]:
    """The text's token ids in consecutive windows, each opened by BOS when the model has one (every
    token of a window after its first is scored, predicted from the window's earlier tokens)."""
    if window < 2:
        raise EditError(f"a perplexity window needs at least 2 tokens, not {window}")
    ids = model.tokenizer.tok.encode(text, add_special_tokens=False).ids
    bos = [model.tokenizer.bos_id] if model.tokenizer.bos_id is not None else []
    step = min(window, model.config.context_length) - len(bos)
    out = [bos + list(ids[i: i + step]) for i in range(0, len(ids), step)]
    out = [w for w in out if len(w) >= 2]
    if not out:
        raise EditError("the held-out text has too few tokens to score")
    return out


def perplexity(model: Model, text: str, window: int = WINDOW, piece: int = PIECE) -> Perplexity:
    """exp(mean NLL) of `text` under `model`: each window runs `piece` tokens at a time through one
    KV cache, so no more than `piece` rows of logits exist at once."""
    total, count = 0.0, 0
    for ids in windows(model, text, window):
        cache = model.new_cache(len(ids))
        for start in range(0, len(ids) - 1, piece):
            chunk = ids[start: min(start + piece, len(ids) - 1)]  # the last token predicts nothing
            (logits,) = model.forward_batch([chunk], caches=[cache])  # (len(chunk), vocab)
            want = np.asarray(ids[start + 1: start + 1 + len(chunk)])  # the next token of each row
            total += float(np.sum(nll(logits, want, overwrite=True)))
            count += len(want)
    return Perplexity(total / count, count)
