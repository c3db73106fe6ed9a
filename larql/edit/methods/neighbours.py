"""Subjects that look like the edited one, found in the model's own embedding: the keys to hold still.

A weight edit moves every key in proportion to its overlap with the edited key. The keys that
overlap most are those of similar subjects — Madrid's edit leaks into Barcelona and Seville before
anything else (single ROME edits on gemma3-270m: NS 17 for "Madrid -> England" with only a fixed
decoy list). So each edit also holds still (dW k = 0) the keys of the subject's nearest neighbours:
whole-word tokens whose input embedding is closest (cosine) to the subject's last token's, shaped
like it (capitalised when it is), put into the fact's own prompt. Holding a few of them removes the
shared "Spanish city" directions from the update, which protects the neighbours not held as well.

Callers that measure locality must exclude their held-out subjects (`exclude`), so that the score
is about subjects the edit never saw (benchmarks/bench_editing.py does).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Collection

import numpy as np
from numpy.typing import NDArray

from larql.edit.methods.defaults import N_NEIGHBOURS
from larql.vindex.store import Vindex

_WORD = re.compile(r"[^\W\d_][\w'-]*\Z")
_CHUNK = 32768
_SPACE = ("\u2581", "\u0120")  # ▁ Ġ


class _Candidates:
    """The whole-word tokens of a vocabulary, split by capitalisation (a subject's neighbours are
    shaped like it), each class's unit-length embeddings `(n, hidden)` float32 built when first asked
    for: gemma3-270m's capitalised words (31k rows, 80 MB) serve names without paying for the 75k
    lowercase ones (190 MB)."""

    def __init__(self, store: Vindex) -> None:
        ids: dict[bool, list[int]] = {True: [], False: []}
        words: dict[bool, list[str]] = {True: [], False: []}
        # a word-start token (SentencePiece's "▁", byte-level BPE's "Ġ": a leading space) that is a
        # whole word of 3+ letters; pieces read by id (decoding each is 2x slower, get_vocab 7x)
        tok = store.tokenizer.tok
        for i in range(store.vocab_size):
            piece = tok.id_to_token(i) or ""
            word = piece[1:]
            if piece[:1] in _SPACE and len(word) >= 3 and _WORD.match(word):
                ids[word[:1].isupper()].append(i)
                words[word[:1].isupper()].append(word)
        self.ids = {cap: np.asarray(i, np.int64) for cap, i in ids.items()}
        self.words = words
        self._rows: dict[bool, NDArray[np.float32]] = {}

    def rows(self, store: Vindex, capital: bool) -> NDArray[np.float32]:
        # the store is passed, not kept: the cache below is keyed weakly on it
        if capital not in self._rows:
            idx, emb = self.ids[capital], store.embeddings
            rows = np.empty((len(idx), emb.shape[1]), np.float32)
            for i in range(0, len(idx), _CHUNK):
                rows[i: i + _CHUNK] = emb[idx[i: i + _CHUNK]]
            rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-6)
            self._rows[capital] = rows
        return self._rows[capital]


_cache: weakref.WeakKeyDictionary[Vindex, _Candidates] = weakref.WeakKeyDictionary()


def similar_subjects(store: Vindex, subject: str, n: int = N_NEIGHBOURS, exclude: Collection[str] = ()) -> list[str]:
    """Up to `n` whole-word names nearest to the subject's last token in the input embedding."""
    if n <= 0:
        return []
    if store not in _cache:
        _cache[store] = _Candidates(store)
    cand = _cache[store]
    ids = store.tokenizer.tok.encode(" " + subject.strip(), add_special_tokens=False).ids
    if not ids:
        return []
    q: NDArray[np.float32] = np.asarray(store.embeddings[ids[-1]], np.float32)
    q = q / max(float(np.linalg.norm(q)), 1e-6)
    capital = subject.split()[-1][:1].isupper()  # "the Eiffel Tower": like Tower
    sims = cand.rows(store, capital) @ q
    words = cand.words[capital]
    banned = {w.lower() for w in exclude} | {w.lower() for w in re.findall(r"\w+", subject)}
    out: list[str] = []
    seen: set[str] = set()
    for j in np.argsort(-sims)[: 50 * n]:
        word = words[int(j)]
        key = word.lower()
        if key in seen or key in banned:
            continue
        seen.add(key)
        out.append(word)
        if len(out) == n:
            break
    return out
