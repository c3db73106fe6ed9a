"""Crown discovery: which layer's MLP carries a fact (the RFC's phase A).

For a prompt and the token it is expected to produce, zero each layer's MLP output (before Gemma's
post-FFN norm; nothing reaches the residual) at one position and see what happens to the expected
token at the last position: its probability, its rank, and whether the top-1 flips away from it.
Two sites, measured separately:
- the last position (where the answer is read out; the RFC's ablation), and
- the subject's last token (where ROME/MEMIT key their weight edits; beyond the RFC) — the layer
  where this ablation hurts most is where a weight edit of the fact belongs.
The crown layer of a site is the one whose ablation lowers p(expected) most.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from larql.errors import EditError
from larql.model.hooks import Zero
from larql.model.targets import HasTokenizer, subject_position, target_ids

SITES = ("last", "subject")


@dataclass(frozen=True)
class CrownLayer:
    layer: int
    site: str  # "last" | "subject"
    p: float  # p(expected) at the last position with this layer's MLP output zeroed at the site
    rank: int
    flipped: bool  # the expected token was the top-1 and no longer is

    def delta(self, p_base: float) -> float:
        return self.p - p_base


@dataclass(frozen=True)
class CrownReport:
    prompt: str
    expected: str
    token_id: int
    token: str
    subject: str | None
    subject_position: int | None
    p_base: float
    rank_base: int
    layers: tuple[CrownLayer, ...]

    def crown(self, site: str = "last") -> CrownLayer:
        """The layer whose ablation at `site` lowers p(expected) most."""
        rows = [r for r in self.layers if r.site == site]
        if not rows:
            raise EditError(f"no ablations at the {site} site (give a subject for the subject site)")
        return min(rows, key=lambda r: r.p)


def _p_rank(logits: NDArray[np.float32], token: int) -> tuple[float, int, int]:
    z = logits.astype(np.float64) - float(logits.max())
    p = np.exp(z)
    p /= p.sum()
    return float(p[token]), int(np.sum(p > p[token])) + 1, int(np.argmax(p))


class Ablatable(HasTokenizer, Protocol):
    """What crown discovery runs: a model's next-token logits under hooks (a `Model`)."""

    @property
    def config(self) -> Any: ...

    def tokenize(self, text: str) -> list[int]: ...

    def check_fits(self, ids: list[int], max_new_tokens: int = 0) -> None: ...

    def next_logits(self, ids: list[int], cache: Any = None, hooks: Any = None) -> NDArray[np.float32]: ...


def find_crown(model: Ablatable, prompt: str, expected: str, subject: str | None = None,
               layers: list[int] | None = None) -> CrownReport:
    """Ablate each layer's MLP output at the last position (and at the subject's last token when
    `subject` is given); `expected` is scored by its first token (" " + expected)."""
    n = model.config.n_layers
    layers = list(range(n)) if layers is None else layers
    for layer in layers:
        if not 0 <= layer < n:
            raise EditError(f"layer {layer} is out of range (layers 0-{n - 1})")
    tok = target_ids(model, expected)[0]
    if subject is not None:
        ids, s_pos = subject_position(model, prompt, subject)
    else:
        ids, s_pos = model.tokenize(prompt), None
    model.check_fits(ids)
    last = len(ids) - 1
    p0, r0, top0 = _p_rank(model.next_logits(ids), tok)
    rows = []
    sites = [("last", last)] + ([("subject", s_pos)] if s_pos is not None else [])
    for site, pos in sites:
        for layer in layers:
            p, rank, top = _p_rank(model.next_logits(ids, hooks={f"blocks.{layer}.hook_mlp_out": Zero(positions=pos)}),
                                   tok)
            rows.append(CrownLayer(layer, site, p, rank, top0 == tok and top != tok))
    return CrownReport(prompt, expected, tok, model.tokenizer.token_text(tok), subject, s_pos, p0, r0, tuple(rows))
