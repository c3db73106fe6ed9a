"""Tokenizers built with the `tokenizers` library from GGUF metadata or an HF tokenizer.json.

GGUF `tokenizer.ggml.model`:
- `llama` (SentencePiece vocab with scores, e.g. Gemma): a BPE model with byte fallback whose merges
  are derived from the vocab and its scores (every split of a piece into two pieces of the vocab,
  ranked by the merged piece's score), a normalizer turning " " into "▁", and the decoder
  Replace("▁" -> " "), ByteFallback, Fuse.
- `gpt2` (byte-level BPE, e.g. SmolLM2): the merges stored in the GGUF, with the pre-tokenizer the
  `tokenizer.ggml.pre` key names.
Token types: 3 (control) become special added tokens, 4 (user-defined, e.g. Gemma's runs of
newlines) plain added tokens matched before BPE, as llama.cpp does. Deriving Gemma's 515k merges
takes 1-3 s, so they are cached (token ids, keyed by a hash of the vocabulary); the tokenizer is
built from them in each process.
"""

from __future__ import annotations

import hashlib
import re
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from larql.errors import TokenizerError
from larql.io.cachedir import cache_dir
from larql.io.jsonfile import read_json
from larql.io.tempfiles import write_cache

CONTROL, USER_DEFINED = 3, 4
_STOP_NAMES = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>")


class TextTokenizer:
    """encode/decode plus the ids generation needs (BOS, the stop tokens)."""

    def __init__(self, tok: Tokenizer, bos_id: int | None, eos_ids: tuple[int, ...]) -> None:
        self.tok = tok
        self.bos_id = bos_id
        self.eos_ids = eos_ids
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: list[int] | np.ndarray) -> str:
        return str(self.tok.decode([int(i) for i in ids], skip_special_tokens=False))

    def token_text(self, token_id: int) -> str:
        """How one token reads on its own (for tables of next-token candidates)."""
        return self.decode([token_id])

    def token_to_id(self, text: str) -> int | None:
        return self.tok.token_to_id(text)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: its text in UTF-8, or, for a token that is part of a
        multi-byte character (a byte-fallback `<0xE2>` or a byte-level piece), its raw bytes."""
        text = self.decode([token_id])
        if "\ufffd" not in text:
            return text.encode("utf-8")
        piece = self.tok.id_to_token(token_id) or ""
        if m := re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece):
            return bytes([int(m[1], 16)])
        table = _byte_level_chars()
        if piece and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return text.encode("utf-8")


def _byte_level_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the printable character standing for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    chars, extra = {b: b for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


def _bos_processor(bos: str, bos_id: int) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, bos_id)])


def _spm_merge_ids(tokens: list[str], scores: np.ndarray) -> np.ndarray:
    """Every split of a piece into two pieces of the vocab, as (left id, right id) rows `[n, 2]`,
    ranked by the merged piece's score, highest first; ties in vocabulary order of the merged piece,
    then of (left, right) ids.

    The splits are looked up one cut position at a time over all pieces longer than it, through
    C-level map/fromiter: a Python loop over Gemma's 1.2M cuts took 2.3-2.8 s, this 1.2-1.5 s
    (the string hashing that remains is the lookups' own cost).
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    get = vocab.get
    lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    pieces, lefts, rights = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for cut in range(1, int(lengths.max(initial=0))):
        idx = np.flatnonzero(lengths > cut)
        group = list(map(tokens.__getitem__, idx.tolist()))
        left = np.fromiter(map(get, map(itemgetter(slice(None, cut)), group), repeat(-1)),
                           dtype=np.int64, count=len(group))
        hit = np.flatnonzero(left >= 0)
        tails = map(itemgetter(slice(cut, None)), map(group.__getitem__, hit.tolist()))
        right = np.fromiter(map(get, tails, repeat(-1)), dtype=np.int64, count=len(hit))
        ok = right >= 0
        pieces.append(idx[hit[ok]])
        lefts.append(left[hit[ok]])
        rights.append(right[ok])
    piece, left, right = np.concatenate(pieces), np.concatenate(lefts), np.concatenate(rights)
    # lexsort is stable and its last key is the primary one: score, then piece, left, right ids
    order = np.lexsort((right, left, piece, -scores[piece]))
    return np.stack([left[order], right[order]], axis=1)


def _spm_merges(tokens: list[str], scores: np.ndarray, key: str | None = None) -> list[tuple[str, str]]:
    """The merges of `_spm_merge_ids` as token strings (the BPE model's input), the ids cached
    under `key` in the cache directory (an `.npy` of int32 pairs, written to a private name and
    renamed into place by io/tempfiles.write_cache; one that does not load or does not fit the vocabulary is rebuilt)."""
    path = None if key is None else cache_dir() / "tokenizers" / f"{key}-spm-merges.npy"
    ids = None
    if path is not None and path.is_file():
        try:
            ids = np.load(path, allow_pickle=False)
        except (OSError, ValueError):
            ids = None
        if ids is not None and not (ids.ndim == 2 and ids.shape[1] == 2 and ids.dtype == np.int32
                                    and (ids.size == 0 or (ids.min() >= 0 and ids.max() < len(tokens)))):
            ids = None
    if ids is None:
        ids = _spm_merge_ids(tokens, scores).astype(np.int32)
        if path is not None:  # caching is an optimisation; a read-only home still works
            write_cache(path, lambda f: np.save(f, ids))
    return [(tokens[a], tokens[b]) for a, b in ids.tolist()]


def _added_tokens(tok: Tokenizer, tokens: list[str], types: np.ndarray | None) -> None:
    if types is None:
        return
    special = [AddedToken(tokens[i], special=True, normalized=False) for i in np.flatnonzero(types == CONTROL)]
    user = [AddedToken(tokens[i], special=False, normalized=False) for i in np.flatnonzero(types == USER_DEFINED)]
    tok.add_special_tokens(special)
    tok.add_tokens(user)


def _build_from_gguf(meta: dict[str, Any], source: str, key: str | None = None) -> Tokenizer:
    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type")
    types = np.asarray(types) if types is not None else None
    vocab = {t: i for i, t in enumerate(tokens)}
    if kind == "llama":
        scores = np.asarray(meta.get("tokenizer.ggml.scores", np.zeros(len(tokens))), dtype=np.float64)
        unk_id = int(meta.get("tokenizer.ggml.unknown_token_id", 0))
        tok = Tokenizer(models.BPE(vocab, _spm_merges(tokens, scores, key), unk_token=tokens[unk_id],
                                   byte_fallback=True, fuse_unk=True))
        norms: list[normalizers.Normalizer] = [normalizers.Replace(" ", "▁")]
        if meta.get("tokenizer.ggml.add_space_prefix", False):
            norms.insert(0, normalizers.Prepend("▁"))
        tok.normalizer = normalizers.Sequence(norms)
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    elif kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        tok = Tokenizer(models.BPE(vocab, merges))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre in ("smollm", "starcoder", "refact"):
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        elif pre in ("llama3", "llama-bpe", "qwen2", "deepseek-llm"):
            split = pre_tokenizers.Split(Regex(
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+"), behavior="isolated")
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel()
    else:
        raise TokenizerError(f"{source}: tokenizer model {kind!r} is not supported (llama or gpt2)")
    _added_tokens(tok, tokens, types)
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", kind == "llama") and bos_id is not None:
        tok.post_processor = _bos_processor(tokens[int(bos_id)], int(bos_id))
    return tok


def _stop_ids(tok: Tokenizer, eos: list[int]) -> tuple[int, ...]:
    ids = list(eos)
    for name in _STOP_NAMES:
        i = tok.token_to_id(name)
        if i is not None and i not in ids:
            ids.append(i)
    return tuple(ids)


def tokenizer_from_gguf(meta: dict[str, Any], source: str) -> TextTokenizer:
    if "tokenizer.ggml.tokens" not in meta:
        raise TokenizerError(f"{source}: the GGUF has no tokenizer (tokenizer.ggml.tokens is missing)")
    h = hashlib.sha256()
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token",
                "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.bos_token_id"):
        h.update(repr(meta.get(key)).encode())
    h.update("\x00".join(meta["tokenizer.ggml.tokens"]).encode("utf-8", "surrogatepass"))
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in meta:
            h.update(np.asarray(meta[key]).tobytes())
    if "tokenizer.ggml.merges" in meta:
        h.update("\x00".join(meta["tokenizer.ggml.merges"]).encode())
    # Only Gemma-style merges (derived from the vocab: 515k of them, 1-3 s) are cached. The
    # tokenizer itself is built from them each time: loading the whole tokenizer as JSON took
    # 1.8-2.1 s, building its BPE model from Python lists 0.85 s.
    tok = _build_from_gguf(meta, source, h.hexdigest()[:32])
    eos = meta.get("tokenizer.ggml.eos_token_id")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    return TextTokenizer(tok, None if bos is None else int(bos), _stop_ids(tok, [] if eos is None else [int(eos)]))


def _token_id(t: Any, vocab: int) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab


def tokenizer_from_hf(directory: Path, hf_config: dict[str, Any]) -> TextTokenizer:
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"{directory}: no tokenizer.json")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:
        raise TokenizerError(f"{path}: cannot read tokenizer ({e})") from e
    eos = hf_config.get("eos_token_id")
    gen = directory / "generation_config.json"
    if gen.is_file():
        doc = read_json(gen, 1 << 20, 16, "generation config", TokenizerError)
        eos = doc.get("eos_token_id", eos) if isinstance(doc, dict) else eos
    eos_list = [] if eos is None else ([eos] if isinstance(eos, int) else eos)
    bos = hf_config.get("bos_token_id")
    vocab = tok.get_vocab_size()
    if not isinstance(eos_list, list) or not all(_token_id(t, vocab) for t in eos_list) or \
            (bos is not None and not _token_id(bos, vocab)):
        raise TokenizerError(f"{directory}: bos_token_id / eos_token_id must be token ids below {vocab:,} "
                             f"(config.json or generation_config.json)")
    return TextTokenizer(tok, bos, _stop_ids(tok, eos_list))
