"""What DESCRIBE's edges are made of, shared by the feature edges (describe.py), the probe edges
(probes.py), BROWSE and the clusters: the Edge value and which tokens are readable words worth
showing."""

from __future__ import annotations

import re
from dataclasses import dataclass

STOP_WORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further had has
have having he her here hers herself him himself his how i if in into is it its itself just me more
most my myself no nor not now of off on once only or other our ours out over own same she should so
some such than that the their theirs them then there these they this those through to too under
until up very was we were what when where which while who whom why will with would you your yours
""".split())
_CAMEL = re.compile(r"[a-z][A-Z]")


def clean_token(token: str) -> str:
    return token.replace("▁", " ").strip()


def is_content_token(token: str) -> bool:
    """A readable word worth showing as an edge: 3-25 characters, mostly ASCII letters, not
    camelCase, not a stop word."""
    t = clean_token(token)
    if not 3 <= len(t) <= 25 or t.lower() in STOP_WORDS or _CAMEL.search(t):
        return False
    if any(c.isalpha() and not c.isascii() for c in t):
        return False
    letters = sum(c.isalpha() for c in t)
    return letters / len(t) >= 0.8 and t[0].isalpha()


@dataclass(frozen=True)
class Edge:
    target: str
    score: float  # feature edges: the gate score; probe edges: probability of the answer's first token
    layer: int  # feature edges: the layer of the strongest hit; probe edges: -1
    feature: int
    source: str  # "feature" | "probe"
    label: str | None = None  # probe edges: the relation
    layers: tuple[int, ...] = ()
    hits: int = 1
    also: tuple[str, ...] = ()
