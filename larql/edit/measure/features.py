"""What an edit did in an SAE's (or transcoder's) features: which features rose and fell at the last
token of the edited prompts, and how much of the unrelated prompts' strongest features stayed — a
feature-level locality report beside the report's top-1s.

A feature read at a hook point before the edit's first layer cannot change (the forward pass up to
there is the same), so its shift is all zeros; one after it shows what the edit wrote in the terms
the SAE's author chose."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from larql.model.interp import feature_top_tokens, sae_activations
from larql.model.model import Model
from larql.model.sae import SAE

F32 = NDArray[np.float32]
TOP_K = 8  # an unrelated prompt's strongest features compared before and after
SHOWN = 3  # features listed as rising and as falling, per SAE
N_TOKENS = 3  # tokens a listed feature writes (residual-width SAEs)


@dataclass(frozen=True)
class FeatureChange:
    """One feature's mean activation over the edited prompts' last tokens, before and after, and
    the tokens its decoder row writes most (empty where the SAE does not write the residual)."""

    feature: int
    before: float
    after: float
    tokens: tuple[str, ...] = ()


@dataclass(frozen=True)
class FeatureShift:
    """An edit seen through one SAE at its hook point."""

    hook: str
    rose: tuple[FeatureChange, ...]  # the largest rises on the edited prompts, largest first
    fell: tuple[FeatureChange, ...]  # the largest falls
    edited_change: float  # sum |after - before| / sum |before| over the edited prompts' features
    unrelated_kept: float  # mean share of each unrelated prompt's TOP_K features still in its TOP_K
    unrelated_change: float  # sum |after - before| / sum |before| over the unrelated prompts' features


def last_token_features(model: Model, saes: Sequence[SAE], prompts: Sequence[str]) -> dict[str, F32]:
    """Each SAE's feature activations at the last token of each prompt, `{hook: (n_prompts, d_sae)}`,
    read with the error term on (the model runs as without the SAEs)."""
    rows: dict[str, list[F32]] = {s.hook_name: [] for s in saes}
    for p in prompts:
        _, acts = sae_activations(model, model.tokenize(p), saes)  # {hook: (T, d_sae)}
        for hook, a in acts.items():
            rows[hook].append(np.asarray(a[-1], np.float32))
    return {h: np.stack(r) if r else np.zeros((0, 0), np.float32) for h, r in rows.items()}


def _relative(before: F32, after: F32) -> float:
    size = float(np.abs(before).sum())
    change = float(np.abs(after - before).sum())
    return change / size if size > 0 else (0.0 if change == 0 else float("inf"))


def _top(row: F32, k: int) -> set[int]:
    """The ids of a row's k largest activations above 0 (ties to the lower id)."""
    order = np.lexsort((np.arange(len(row)), -row))[:k]
    return {int(f) for f in order if row[f] > 0}


def feature_shift(hook: str, edited_before: F32, edited_after: F32, unrelated_before: F32, unrelated_after: F32,
                  k: int = TOP_K, shown: int = SHOWN) -> FeatureShift:
    """The shift of one SAE's features from `*_before` to `*_after` `(n_prompts, d_sae)`: the `shown`
    features whose mean over the edited prompts rose most and fell most (a change of 0 is not listed;
    ties to the lower id), and the unrelated prompts' top-`k` overlap and relative change."""
    delta = (edited_after - edited_before).mean(axis=0) if len(edited_before) else np.zeros(0)
    mean0 = edited_before.mean(axis=0) if len(edited_before) else delta
    mean1 = edited_after.mean(axis=0) if len(edited_after) else delta
    ids = np.arange(len(delta))

    def pick(sign: float) -> tuple[FeatureChange, ...]:
        order = np.lexsort((ids, -sign * delta))[:shown]
        return tuple(FeatureChange(int(f), float(mean0[f]), float(mean1[f])) for f in order if sign * delta[f] > 0)

    tops = [(_top(b, k), _top(a, k)) for b, a in zip(unrelated_before, unrelated_after)]
    kept = [len(tb & ta) / len(tb) for tb, ta in tops if tb]
    return FeatureShift(hook, pick(1.0), pick(-1.0), _relative(edited_before, edited_after),
                        float(np.mean(kept)) if kept else 1.0, _relative(unrelated_before, unrelated_after))


def with_tokens(model: Model, sae: SAE, shift: FeatureShift, n_tokens: int = N_TOKENS) -> FeatureShift:
    """`shift` with each listed feature's top tokens, where the SAE writes the residual stream."""
    if sae.d_out != model.config.hidden:
        return shift

    def named(c: FeatureChange) -> FeatureChange:
        toks = tuple(model.detokenize([t]) for t, _ in feature_top_tokens(model, sae, c.feature, n_tokens))
        return FeatureChange(c.feature, c.before, c.after, toks)

    return FeatureShift(shift.hook, tuple(map(named, shift.rose)), tuple(map(named, shift.fell)),
                        shift.edited_change, shift.unrelated_kept, shift.unrelated_change)
