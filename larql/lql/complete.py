"""Completion as a pure function: (text before the cursor, catalog) -> suggestions.

Outside quotes it offers what the grammar accepts next (Lark's interactive LALR parser is fed the
statement so far); inside quotes it offers file paths after USE / EXTRACT / INTO / STATS / PATCH and
entity tokens from the vindex vocabulary elsewhere. No terminal is involved, so it is tested directly.
"""

from __future__ import annotations

import bisect
import glob
import heapq
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from lark.exceptions import LarkError

from larql.lql.parser import lark_parser

PATH_KEYWORDS = ("USE", "INTO", "STATS", "PATCH", "MERGE", "DIFF", "SAVE", "FROM")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Suggestion:
    text: str  # what to insert
    start: int  # relative to the cursor: replace the `-start` characters before it
    kind: str  # keyword | path | entity


def current_statement(text: str) -> str:
    """The statement the cursor is in: the text after the last ';' that is outside quotes."""
    quote, start = "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == ";":
            start = i + 1
    return text[start:]


def _open_quote(stmt: str) -> tuple[str, int] | None:
    """(partial string, index of its opening quote) when the cursor is inside a string."""
    quote, at = "", -1
    for i, ch in enumerate(stmt):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote, at = ch, i
    return (stmt[at + 1:], at) if quote else None


def keywords_accepted(prefix: str) -> list[str]:
    """Keyword terminals the grammar accepts after `prefix` (an incomplete statement)."""
    try:
        ip = lark_parser().parse_interactive(prefix)
        ip.exhaust_lexer()
        accepted = ip.accepts()
    except (LarkError, ValueError):
        return []
    terminals = lark_parser().terminals
    patterns = {t.name: t.pattern for t in terminals}
    out = []
    for name in accepted:
        pat = patterns.get(name)
        if pat is not None and pat.type == "str" and str(pat.value).replace("_", "").isalpha():
            out.append(str(pat.value).upper())
    return sorted(set(out))


def complete(text: str, entities: Callable[[str], Iterable[str]] | None = None,
             cwd: str = ".", limit: int = 50) -> list[Suggestion]:
    """Suggestions for the cursor at the end of `text`."""
    stmt = current_statement(text)
    inside = _open_quote(stmt)
    if inside is not None:
        partial, at = inside
        before = stmt[:at].split()
        if before and before[-1].upper() in PATH_KEYWORDS:
            pattern = os.path.join(cwd, os.path.expanduser(partial)) + "*"
            paths = sorted(glob.glob(pattern))[:limit]
            rel = [p[len(cwd) + 1:] if cwd != "." and p.startswith(cwd + os.sep) else p.removeprefix("./") for p in paths]
            return [Suggestion(p + ("/" if os.path.isdir(os.path.join(cwd, p)) else ""), len(partial), "path") for p in rel]
        if entities is None or not partial:
            return []
        return [Suggestion(e, len(partial), "entity") for e in list(entities(partial))[:limit]]
    m = _WORD.search(stmt)
    word = m.group(0) if m and (m.start() == 0 or not stmt[m.start() - 1].isalnum()) else ""
    prefix = stmt[: len(stmt) - len(word)]
    accepted = keywords_accepted(prefix)
    return [Suggestion(k, len(word), "keyword") for k in accepted if k.startswith(word.upper())][:limit]


# how a tokenizer marks a token that starts a word: SentencePiece, GPT-2 byte-level BPE, plain
_WORD_MARKERS = ("\u2581", "\u0120", " ")


def entity_rank(word: str, token_id: int, ids: Mapping[str, int]) -> tuple[int, int]:
    """How likely a whole-word token is an entity, as a sort key (smaller first).

    Tier 0: capitalised, and its lower-case spelling is rarer (a larger id, or no token at all):
    " France" (7001) over " france" (61034). Tier 1: capitalised but more common in lower case,
    i.e. a sentence-initial word: " The" (669) under " the" (506). Tier 2: lower case. Within a
    tier, smaller ids first: SentencePiece and BPE vocabularies number tokens roughly by frequency.
    """
    if not word[:1].isupper():
        return (2, token_id)
    lower = min((ids[m + word.lower()] for m in _WORD_MARKERS if m + word.lower() in ids), default=None)
    return (0 if lower is None or lower > token_id else 1, token_id)


def vocabulary_lookup(ids: Mapping[str, int]) -> Callable[[str], list[str]]:
    """An entity source over a vocabulary (token piece -> id): the whole-word tokens that start with
    the typed prefix (any case), most entity-like first (`entity_rank`).

    Built once (about a second for gemma3-270m's 262,144 pieces); each lookup is a bisect into the
    words sorted by lower case plus a partial sort of the matches, a few ms even for one letter.
    """
    entries: dict[str, tuple[int, int]] = {}
    for piece, token_id in ids.items():
        if piece[:1] in _WORD_MARKERS:
            word = piece[1:]
            if len(word) >= 2 and word.isalpha():
                rank = entity_rank(word, token_id, ids)
                entries[word] = min(entries.get(word, rank), rank)
    order = sorted(entries, key=lambda w: (w.lower(), w))
    keys = [w.lower() for w in order]
    ranks = [entries[w] for w in order]

    def lookup(partial: str, limit: int = 50) -> list[str]:
        p = partial.lower()
        lo, hi = bisect.bisect_left(keys, p), bisect.bisect_left(keys, p + "\U0010ffff")
        return [order[i] for i in heapq.nsmallest(limit, range(lo, hi), key=ranks.__getitem__)]

    return lookup
