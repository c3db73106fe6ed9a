"""Gemma-style merges derived from a vocab: the vectorized derivation equals the plain definition,
and the cached ids are reused, or rebuilt when damaged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from larql.model import tokenizer as T


def _plain(tokens: list[str], scores: np.ndarray) -> list[tuple[str, str]]:
    """The definition: every split of a piece into two vocab pieces, by score, ties in vocab order."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for piece, score in zip(tokens, scores.tolist()):
        local = sorted((vocab[piece[:c]], vocab[piece[c:]]) for c in range(1, len(piece))
                       if piece[:c] in vocab and piece[c:] in vocab)
        ranked.extend((score, tokens[a], tokens[b]) for a, b in local)
    ranked.sort(key=lambda r: -r[0])
    return [(a, b) for _, a, b in ranked]


def test_merges_equal_the_definition() -> None:
    rng = np.random.default_rng(0)
    alphabet = ["a", "b", "▁", "é", "日"]
    tokens = list(alphabet)
    while len(tokens) < 300:
        t = "".join(rng.choice(alphabet, size=int(rng.integers(2, 7))))
        if t not in tokens:
            tokens.append(t)
    scores = np.round(rng.normal(size=len(tokens)), 1)  # rounded: many ties
    assert T._spm_merges(tokens, scores) == _plain(tokens, scores)
    assert T._spm_merges([], np.zeros(0)) == []


def test_merge_cache_reused_and_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LARQL_CACHE", str(tmp_path))
    tokens, scores = ["a", "b", "ab", "ba", "aba"], np.array([0, 0, -1.0, -2.0, -0.5])
    want = _plain(tokens, scores)
    assert T._spm_merges(tokens, scores, "k") == want
    path = tmp_path / "tokenizers" / "k-spm-merges.npy"
    np.save(path, np.array([[1, 0]], dtype=np.int32))  # a cached entry is what is used...
    assert T._spm_merges(tokens, scores, "k") == [("b", "a")]
    path.write_bytes(b"damaged")  # ...unless it does not load
    assert T._spm_merges(tokens, scores, "k") == want
    np.save(path, np.array([[0, 9]], dtype=np.int32))  # or names ids outside the vocabulary
    assert T._spm_merges(tokens, scores, "k") == want
