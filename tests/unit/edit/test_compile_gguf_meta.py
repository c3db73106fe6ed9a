"""COMPILE ... FORMAT GGUF without the source GGUF: the metadata is rebuilt from the vindex (the keys
and values the source held, the same tokenizer), and the compiled file runs as the vindex does,
also for a vindex extracted from an HF directory (llama's q/k rows interleaved as llama.cpp wants)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import larql
from larql.lql.executor import execute
from larql.lql.session import Session
from larql.model.gguf_file import GGUFFile
from larql.model.gguf_meta import tokenizer_fields
from larql.model.tokenizer import tokenizer_from_gguf
from larql.vindex.extract import extract
from tests.synthetic import TinySpec, hf_weights, tiny_vindex, write_hf_dir

IDS = [5, 80, 81, 120, 7, 7, 9]
TEXTS = ("hello there", "The capital of France is", "  two  spaces\nand a newline", "ünïcödé 123")


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_compiled_without_the_source_gguf(arch: str, tmp_path: Path) -> None:
    vx = tiny_vindex(tmp_path, TinySpec(arch, n_layers=4, ffn=96), seed=3)
    src = tmp_path / "m.gguf"
    moved = src.rename(tmp_path / "away.gguf")  # the vindex's source is gone
    s = Session()
    execute(f'USE "{vx}"; DELETE FROM EDGES WHERE layer = 1 AND feature = 4', s)
    live = s.vindex.model().forward(IDS)  # type: ignore[union-attr]
    out = tmp_path / "c.gguf"
    execute(f'COMPILE CURRENT INTO MODEL "{out}" FORMAT GGUF', s)
    got, want = GGUFFile(out).metadata, GGUFFile(moved).metadata
    for key, value in want.items():  # every key the source held, with its value
        assert key in got, key
        assert np.array_equal(np.asarray(got[key]), np.asarray(value)) or got[key] == pytest.approx(value), key
    compiled, base = larql.load(out), larql.load(moved)
    # the tiny source has no llama.vocab_size (a converter's GGUF has); the rebuilt one states it
    assert dataclasses.replace(compiled.config, vocab=base.config.vocab) == base.config
    assert compiled.config.vocab in (base.config.vocab, 257)
    assert all(compiled.tokenize(t) == base.tokenize(t) for t in TEXTS)
    assert np.max(np.abs(compiled.forward(IDS) - live)) <= 1e-4 * np.max(np.abs(live))


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_a_vindex_from_an_hf_directory_compiles_to_a_gguf(arch: str, tmp_path: Path) -> None:
    spec = TinySpec(arch, n_layers=2, ffn=96)
    hf = write_hf_dir(tmp_path / "hf", spec, hf_weights(spec, seed=4))
    vx = extract(hf, tmp_path / "h.vindex", level="inference", dtype="f32")
    out = tmp_path / "h.gguf"
    s = Session()
    execute(f'USE "{vx}"; COMPILE CURRENT INTO MODEL "{out}" FORMAT GGUF', s)
    compiled = larql.load(out)
    assert compiled.config.rope_interleaved == (arch == "llama")  # llama.cpp's llama layout: rows permuted
    want = larql.load(hf).forward(IDS)
    assert np.max(np.abs(compiled.forward(IDS) - want)) <= 1e-4 * np.max(np.abs(want))


def test_a_sentencepiece_vocabulary_gives_the_same_merges_back() -> None:
    """Scores rebuilt from merge ranks rank the merges as the original scores did, ties included."""
    tokens = ["<unk>", "<s>", "a", "b", "c", "ab", "bc", "abc", "ca", "<0x41>"]
    scores = np.array([0, 0, -5, -5, -5, -1, -1, -0.5, -1, 0], dtype=np.float32)  # ab, bc, ca tie
    types = np.array([2, 3, 1, 1, 1, 1, 1, 1, 1, 6], dtype=np.int32)
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.add_bos_token": True}
    original = tokenizer_from_gguf(meta, "t")
    fields = tokenizer_fields(original.tok.to_str(), 1, [])
    assert fields["tokenizer.ggml.model"] == "llama" and fields["tokenizer.ggml.tokens"] == tokens
    assert fields["tokenizer.ggml.token_type"].tolist() == types.tolist()
    back = tokenizer_from_gguf({**meta, **fields}, "t")
    assert back.tok.to_str() == original.tok.to_str()
    assert [back.encode(t) for t in ("abcab", "cabc bca")] == [original.encode(t) for t in ("abcab", "cabc bca")]
