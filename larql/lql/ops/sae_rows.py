"""The attached SAEs' feature rows, as EXPLAIN INFER, DESCRIBE and FEATURES show them: an SAE is read
at its hook point with its error term added back, so the model's outputs are unchanged; each
feature is shown with the tokens its decoder row writes through the unembedding."""

from __future__ import annotations

from typing import Any

import numpy as np

from larql.lql.plan import Step
from larql.lql.session import AttachedSae, Session
from larql.model.interp import FeatureActivation, sae_activations, top_features


def attached(session: Session, step: Step | None) -> list[AttachedSae]:
    """The attached SAEs a sae_features step reads (none without the step)."""
    return [] if step is None else [session.saes[h] for h in step["hooks"]]


Row = tuple[int, float, str, str, str]  # feature, activation, top token, the next tokens, label


def feature_rows(m: Any, a: AttachedSae, found: list[FeatureActivation]) -> list[Row]:
    """(feature, activation, top token, the next tokens, label) of each feature, as the tables show them."""
    text = m.tokenizer.token_text
    return [(f.feature, f.activation, text(f.top_tokens[0][0]).strip() if f.top_tokens else "",
             ", ".join(text(t).strip() for t, _ in f.top_tokens[1:]), a.labels.get(f.feature, "")) for f in found]


def explain_features(m: Any, saes: list[AttachedSae], cache: dict[str, np.ndarray], step: Step
                     ) -> dict[int | None, list[Row]]:
    """EXPLAIN INFER's SAE rows by layer: each SAE's top features at the last position."""
    out: dict[int | None, list[Row]] = {}
    for a in saes:
        acts = cache[f"{a.sae.hook_name}.hook_sae_acts_post"][-1]  # (d_sae,)
        found = top_features(m, a.sae, acts, step["k"], -1, step["n_tokens"])
        out.setdefault(a.layer, []).extend(feature_rows(m, a, found))
    return out


def describe_features(m: Any, entity: str, saes: list[AttachedSae], step: Step) -> list[list[Any]]:
    """DESCRIBE's SAE rows: per SAE, the features most active (maximum over the entity's tokens, BOS
    left out) on the entity's text run alone."""
    ids = m.tokenize(entity)
    start = 1 if len(ids) > 1 and ids[0] == m.tokenizer.bos_id else 0
    _, acts = sae_activations(m, ids, [a.sae for a in saes])
    rows: list[list[Any]] = []
    for a in saes:
        pooled = acts[a.sae.hook_name][start:].max(axis=0)  # (d_sae,)
        found = top_features(m, a.sae, pooled, step["k"], None, step["n_tokens"])
        where = f"L{a.layer}" if a.layer is not None else a.sae.hook_name
        for f, act, top, more, label in feature_rows(m, a, found):
            name = f"feature {f}" + (f": {label}" if label else "")
            rows.append([f"SAE {a.sae.hook_name}", name, ", ".join(t for t in (top, more) if t), act, where])
    return rows
