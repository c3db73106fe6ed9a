"""Tokenizer ids equal llama.cpp's for every golden prompt; decoding round-trips."""

from __future__ import annotations

import larql
from tests.conftest import golden


def test_ids_match_llamacpp(real_model: larql.Model) -> None:
    for p in golden(real_model.name, "llamacpp"):
        assert real_model.tokenize(p["prompt"]) == p["ids"], p["prompt"]


def test_decode_round_trips(real_model: larql.Model) -> None:
    bos = real_model.tokenizer.bos_id
    for p in golden(real_model.name, "llamacpp"):
        ids = [i for i in real_model.tokenize(p["prompt"]) if i != bos]
        assert real_model.detokenize(ids) == p["prompt"]
    text = "Unicode: é ☃ 日本語 🙂 and  two  spaces\n\nnewlines\t tab"
    ids = [i for i in real_model.tokenize(text) if i != bos]
    assert real_model.detokenize(ids) == text


def test_special_ids(real_model: larql.Model) -> None:
    if real_model.name == "gemma3-270m":
        assert real_model.tokenizer.bos_id == 2 and 1 in real_model.tokenizer.eos_ids
        assert real_model.tokenize("<start_of_turn>user")[:2] == [2, 105]
    else:
        assert real_model.tokenize("Hi")[0] != real_model.tokenizer.bos_id  # no BOS for SmolLM2
        assert 2 in real_model.tokenizer.eos_ids
