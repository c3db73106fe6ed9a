"""Hostile or damaged HF config.json / generation_config.json and edit-set files: each ends in one
LarqlError naming the file, quickly, before anything is allocated from it; never a RecursionError,
a TypeError or a model built from NaN."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

import larql
from larql.edit.measure.evaluate import load_edit_set
from larql.errors import EditError, LarqlError, ModelFormatError
from larql.model.config import config_from_gguf
from tests.synthetic import TinySpec, hf_weights, write_hf_dir

SPEC = TinySpec("gemma3", n_layers=2, ffn=64)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_dir(tmp_path_factory.mktemp("hf") / "m", SPEC, hf_weights(SPEC, seed=1))


def tampered(hf_dir: Path, tmp_path: Path, change: dict[str, Any] | None = None, text: str | None = None,
             name: str = "config.json") -> Path:
    d = tmp_path / "m"
    shutil.copytree(hf_dir, d)
    if text is None:
        cfg = json.loads((hf_dir / "config.json").read_text()) if name == "config.json" else {}
        text = json.dumps({**cfg, **(change or {})}).replace('"__1e400__"', "1e400")  # parses as inf
    (d / name).write_text(text)
    return d


CONFIG_CASES = {
    "num_hidden_layers 2^40": ({"num_hidden_layers": 1 << 40}, "out of range|non-negative integer"),
    "num_hidden_layers -1": ({"num_hidden_layers": -1}, "non-negative integer"),
    "num_hidden_layers a string": ({"num_hidden_layers": "2"}, "non-negative integer"),
    "num_hidden_layers a float": ({"num_hidden_layers": 2.5}, "non-negative integer"),
    "num_hidden_layers true": ({"num_hidden_layers": True}, "non-negative integer"),
    "hidden_size 0": ({"hidden_size": 0}, "out of range"),
    "vocab_size 2^30": ({"vocab_size": 1 << 30}, "out of range"),
    "intermediate_size a list": ({"intermediate_size": [64]}, "non-negative integer"),
    "kv heads not dividing heads": ({"num_key_value_heads": 3}, "key/value heads"),
    "rope_theta 1e400 (inf)": ({"rope_theta": "__1e400__"}, "finite number"),
    "rope_theta 0": ({"rope_theta": 0}, "finite number above 0|expected a positive number"),
    "rms_norm_eps negative": ({"rms_norm_eps": -1e-6}, "finite number above 0|expected a positive number"),
    "query_pre_attn_scalar a string": ({"query_pre_attn_scalar": "x"}, "finite number"),
    "final_logit_softcapping negative": ({"final_logit_softcapping": -3.0}, "0 or more"),
    "model_type a list": ({"model_type": ["llama"]}, "not supported"),
    "num_hidden_layers null": ({"num_hidden_layers": None}, "no num_hidden_layers|missing field 'num_hidden_layers'|non-negative integer|wrong type"),
    "layer_types not strings": ({"layer_types": [1, 2]}, "layer_types"),
    "tie_word_embeddings a string": ({"tie_word_embeddings": "yes"}, "true or false"),
    "eos_token_id past the vocabulary": ({"eos_token_id": 1 << 40}, "token ids below"),
    "bos_token_id negative": ({"bos_token_id": -5}, "token ids below"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_hostile_config_values_are_refused(case: str, hf_dir: Path, tmp_path: Path) -> None:
    change, match = CONFIG_CASES[case]
    d = tampered(hf_dir, tmp_path, change)
    t0 = time.perf_counter()
    with pytest.raises(LarqlError, match=match) as e:
        larql.load(d)
    assert time.perf_counter() - t0 < 2 and str(d) in str(e.value)


@pytest.mark.parametrize("text, match", [
    ("[" * 100_000 + "]" * 100_000, "nested 100000 deep"),
    ('{"model_type": "gemma3_text", "rope_theta": NaN}', "not valid JSON"),
    ("[1, 2, 3]", "must be a JSON object"),
    ('{"model_type": "gemma3", "text_config": 5}', "must be a JSON object"),
    ('{"a": "' + "x" * (5 << 20) + '"}', "more than a model config can be"),
    ("\xff\xfe not utf-8", "not UTF-8|not valid JSON"),
])
def test_hostile_config_files_are_refused(text: str, match: str, hf_dir: Path, tmp_path: Path) -> None:
    d = tampered(hf_dir, tmp_path, text=text)
    if text.startswith("\xff"):
        (d / "config.json").write_bytes(b"\xff\xfe not utf-8")
    t0 = time.perf_counter()
    with pytest.raises(ModelFormatError, match=match):
        larql.load(d)
    assert time.perf_counter() - t0 < 2


def test_config_json_that_is_a_device_or_a_fifo(hf_dir: Path, tmp_path: Path) -> None:
    d = tampered(hf_dir, tmp_path)
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("/dev/zero")
    with pytest.raises(ModelFormatError, match="not a regular file"):
        larql.load(d)
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")
    with pytest.raises(ModelFormatError, match="not a regular file"):  # not opened: a FIFO would block
        larql.load(d)


def test_hostile_generation_config(hf_dir: Path, tmp_path: Path) -> None:
    d = tampered(hf_dir, tmp_path, text="[" * 50_000, name="generation_config.json")
    with pytest.raises(LarqlError, match="generation_config.json"):
        larql.load(d)
    d2 = tampered(hf_dir, tmp_path / "b", text='{"eos_token_id": [1, "x"]}', name="generation_config.json")
    with pytest.raises(LarqlError, match="token ids below"):
        larql.load(d2)


def test_the_untampered_directory_loads(hf_dir: Path) -> None:
    m = larql.load(hf_dir)
    assert m.config.n_layers == SPEC.n_layers and math.isfinite(m.config.rope_base)


def test_gguf_metadata_values_are_checked_too() -> None:
    meta = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
            "llama.feed_forward_length": 128, "llama.attention.head_count": 4}
    assert config_from_gguf(meta, "m.gguf", True).n_layers == 2
    for key, value, match in [("llama.block_count", 1 << 40, "n_layers"), ("llama.rope.freq_base", float("nan"),
                              "rope_base"), ("llama.embedding_length", "x", "wrong type"),
                              ("llama.attention.head_count_kv", 3, "key/value heads"),
                              ("llama.context_length", float("inf"), "wrong type")]:
        with pytest.raises(ModelFormatError, match=match):
            config_from_gguf({**meta, key: value}, "m.gguf", True)


# ---- edit sets

GOOD = {"format": "larql-edit-set", "version": 1,
        "edits": [{"subject": "France", "prompt": "The capital of France is", "target_new": "Rome"}]}


def test_a_good_edit_set_loads(tmp_path: Path) -> None:
    p = tmp_path / "e.json"
    p.write_text(json.dumps(GOOD))
    (rec,) = load_edit_set(p)
    assert rec.subject == "France" and rec.target_new == "Rome"


@pytest.mark.parametrize("text, match", [
    ("[" * 100_000 + "]" * 100_000, "nested 100000 deep"),
    (json.dumps(GOOD).replace('"version": 1', '"version": NaN'), "not valid JSON"),
    (json.dumps(GOOD).replace('"version": 1', '"version": 1e400'), "fails its schema"),
    (json.dumps({**GOOD, "edits": [{**GOOD["edits"][0], "target_new": 5}]}), "fails its schema at edits/0"),
    (json.dumps({**GOOD, "edits": [{**GOOD["edits"][0], "prompt": "x" * 5000}]}), "fails its schema"),
    (json.dumps({**GOOD, "edits": [{**GOOD["edits"][0], "prompt": "no subject here"}]}), "edit 0"),
    (json.dumps({**GOOD, "edits": [GOOD["edits"][0]] * 3, "extra": [[[[[[[[[1]]]]]]]]]}), "nested"),
    ("\x00\x01", "not valid JSON"),
])
def test_hostile_edit_sets_are_refused(text: str, match: str, tmp_path: Path) -> None:
    p = tmp_path / "e.json"
    p.write_text(text)
    t0 = time.perf_counter()
    with pytest.raises(EditError, match=match) as e:
        load_edit_set(p)
    assert time.perf_counter() - t0 < 2 and str(p) in str(e.value)


def test_huge_or_special_edit_set_files_are_not_read(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: 300 MB on paper, refused by its size before a byte is read
        f.truncate(300 << 20)
    with pytest.raises(EditError, match="more than a edit-set can be|bytes, more than"):
        load_edit_set(big)
    with pytest.raises(EditError, match="not a regular file"):
        load_edit_set("/dev/zero")
    with pytest.raises(EditError, match="no such edit-set file"):
        load_edit_set(tmp_path / "missing.json")


# ---- safetensors headers

def _rewrite_header(src: Path, dst: Path, change) -> None:  # type: ignore[no-untyped-def]
    raw = src.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    new = change(header)
    blob = new if isinstance(new, bytes) else json.dumps(new).encode()
    dst.write_bytes(len(blob).to_bytes(8, "little") + blob + raw[8 + n:])


def _first(h: dict[str, Any]) -> str:
    return next(k for k in h if k != "__metadata__")


SAFETENSORS_CASES = {
    "header a list": (lambda h: [1, 2], "not a JSON object"),
    "nested 10,000 deep": (lambda h: b"[" * 10_000 + b"]" * 10_000, "nested 10000 deep"),
    "NaN in the header": (lambda h: json.dumps(h).replace('"F32"', "NaN", 1).encode(), "not valid JSON"),
    "negative offset": (lambda h: {**h, _first(h): {**h[_first(h)], "data_offsets": [-8, 8]}}, "data_offsets"),
    "offsets past the end": (lambda h: {**h, _first(h): {**h[_first(h)], "data_offsets": [0, 1 << 50]}}, "past the end"),
    "shape of strings": (lambda h: {**h, _first(h): {**h[_first(h)], "shape": ["64"]}}, "shape must be"),
    "shape bigger than its bytes": (lambda h: {**h, _first(h): {**h[_first(h)], "shape": [1 << 20, 1 << 10]}},
                                    "span .* not the"),
    "unknown dtype": (lambda h: {**h, _first(h): {**h[_first(h)], "dtype": "F99"}}, "unknown dtype"),
    "entry a string": (lambda h: {**h, _first(h): "x"}, "corrupt safetensors header entry"),
}


@pytest.mark.parametrize("case", list(SAFETENSORS_CASES))
def test_hostile_safetensors_headers_are_refused(case: str, hf_dir: Path, tmp_path: Path) -> None:
    change, match = SAFETENSORS_CASES[case]
    d = tampered(hf_dir, tmp_path)
    _rewrite_header(hf_dir / "model.safetensors", d / "model.safetensors", change)
    t0 = time.perf_counter()
    with pytest.raises(ModelFormatError, match=match):
        larql.load(d)
    assert time.perf_counter() - t0 < 2


def test_a_huge_safetensors_header_length_is_refused_before_reading(hf_dir: Path, tmp_path: Path) -> None:
    d = tampered(hf_dir, tmp_path)
    raw = (hf_dir / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes((1 << 62).to_bytes(8, "little") + raw[8:])
    with pytest.raises(ModelFormatError, match="more than the format's"):
        larql.load(d)
