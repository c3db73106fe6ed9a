"""Bad models and bad requests give one clear LarqlError naming the file and the problem."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

import larql
from larql.errors import ContextLengthError, ModelError, ModelFormatError, UnknownModelError, UnsupportedError
from tests.synthetic import TinySpec, hf_weights, write_gguf


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bad") / "good.gguf"
    write_gguf(path, TinySpec("llama"), hf_weights(TinySpec("llama")), gguf.GGMLQuantizationType.Q8_0)
    return path


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError, match="not a model alias, an existing path or a Hugging Face Hub id"):
        larql.load(tmp_path / "nope.gguf")


def test_unknown_alias() -> None:
    with pytest.raises(UnknownModelError, match=r"gemma-9000: .*aliases: gemma3-270m, smollm2-135m"):
        larql.load("gemma-9000")


@pytest.mark.parametrize("keep", [10, 100, 2000, -100])
def test_truncated_gguf(good_gguf: Path, tmp_path: Path, keep: int) -> None:
    data = good_gguf.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:keep])
    with pytest.raises(ModelFormatError, match=r"cut\.gguf: (truncated|not a GGUF)"):
        larql.load(bad)


def test_bad_magic(good_gguf: Path, tmp_path: Path) -> None:
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"GGML" + good_gguf.read_bytes()[4:])
    with pytest.raises(ModelFormatError, match=r"magic\.gguf: not a GGUF file \(bad magic\)"):
        larql.load(bad)


def test_empty_file(tmp_path: Path) -> None:
    bad = tmp_path / "empty.gguf"
    bad.write_bytes(b"")
    with pytest.raises(ModelFormatError, match="empty.gguf"):
        larql.load(bad)


def test_corrupt_kv_type(good_gguf: Path, tmp_path: Path) -> None:
    data = bytearray(good_gguf.read_bytes())
    # first key starts at 24: u64 length, the key, then its u32 value type
    key_len = struct.unpack_from("<Q", data, 24)[0]
    struct.pack_into("<I", data, 32 + key_len, 99)
    bad = tmp_path / "kv.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match=r"kv\.gguf: corrupt GGUF metadata \(unknown value type 99"):
        larql.load(bad)


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedError, match=r"mamba\.gguf: architecture 'mamba' is not supported \(supported: gemma3, gemma2, llama, qwen2, qwen3, phi3, gpt2\)"):
        larql.load(path)


def test_unsupported_quant_type(good_gguf: Path, tmp_path: Path) -> None:
    reader = gguf.GGUFReader(str(good_gguf))
    t = reader.tensors[-1]
    data = bytearray(good_gguf.read_bytes())
    # the tensor's ggml type field sits right before its u64 offset in the header
    name = t.name.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, 16)  # IQ2_XXS
    bad = tmp_path / "iq.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(UnsupportedError, match=rf"iq\.gguf: tensor {t.name}: ggml type 16 is not supported"):
        larql.load(bad)


def test_hf_dir_without_config(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    with pytest.raises(ModelFormatError, match="not a model directory"):
        larql.load(tmp_path / "model")


def test_prompt_longer_than_context(good_gguf: Path) -> None:
    m = larql.load(good_gguf)  # context 64
    with pytest.raises(ContextLengthError, match="60 prompt tokens \\+ 10 new tokens exceed the context of 64"):
        m.generate(list(range(60)), max_new_tokens=10)
    with pytest.raises(ContextLengthError):
        m.forward(list(range(65)))


def test_token_out_of_vocabulary(good_gguf: Path) -> None:
    m = larql.load(good_gguf)
    with pytest.raises(ModelError, match="token id 9999 is outside the vocabulary"):
        m.forward([1, 9999])


def test_loading_never_writes_the_model(good_gguf: Path, tmp_path: Path) -> None:
    copy = tmp_path / "ro.gguf"
    shutil.copy(good_gguf, copy)
    before = copy.read_bytes()
    larql.load(copy).generate([1, 2, 3], max_new_tokens=3)
    assert copy.read_bytes() == before
