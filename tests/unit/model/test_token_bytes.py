"""`TextTokenizer.token_bytes`: the bytes each token stands for, even a token that is only part of a
multi-byte character (byte-level BPE's pieces in SmolLM2, SentencePiece byte fallback in Gemma);
the tokens' bytes, joined, are the text's UTF-8."""

from __future__ import annotations

import pytest

import larql

TEXT = "naïve café → 日本語 🙂 𓀀 ok"  # the hieroglyph is past Gemma's vocabulary: byte fallback


@pytest.mark.parametrize("alias", ["smollm2-135m", "gemma3-270m"])
def test_tokens_bytes_join_to_the_texts_utf8(alias: str) -> None:
    tok = larql.load(alias).tokenizer
    ids = [i for i in tok.encode(TEXT) if i != tok.bos_id]
    assert b"".join(tok.token_bytes(i) for i in ids) == TEXT.encode("utf-8")
    assert any("\ufffd" in tok.token_text(i) for i in ids)  # some token is a piece of a character
