"""An HF directory larql would run wrongly is refused with one line naming the file, the field and
what is supported: nothing in config.json or the checkpoint is ignored silently."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import larql
from larql.errors import ModelFormatError, UnsupportedError

REFS = Path(__file__).resolve().parents[2] / "golden" / "architectures"


def _copy(tmp_path: Path, arch: str, config: Callable[[dict[str, Any]], None] | None = None,
          tensors: Callable[[dict[str, np.ndarray]], None] | None = None) -> Path:
    d = tmp_path / arch
    shutil.copytree(REFS / arch, d)
    if config is not None:
        c = json.loads((d / "config.json").read_text())
        config(c)
        (d / "config.json").write_text(json.dumps(c))
    if tensors is not None:
        t = load_file(str(d / "model.safetensors"))
        tensors(t)
        save_file(t, str(d / "model.safetensors"))
    return d


def test_unknown_model_type(tmp_path: Path) -> None:
    d = _copy(tmp_path, "llama3", lambda c: c.update(model_type="mamba"))
    with pytest.raises(UnsupportedError, match=r"llama3/config\.json: model_type 'mamba' is not supported "
                                               r"\(supported: llama, mistral, phi3, qwen2, qwen3, gemma2"):
        larql.load(d)


@pytest.mark.parametrize("kind", ["yarn", "dynamic"])
def test_unsupported_rope_type(tmp_path: Path, kind: str) -> None:
    d = _copy(tmp_path, "llama3", lambda c: c["rope_parameters"].update(rope_type=kind))
    with pytest.raises(UnsupportedError, match=rf"config\.json: rope_parameters\.rope_type = '{kind}' is not "
                                               r"supported; larql runs default, linear, llama3, longrope"):
        larql.load(d)


def test_longrope_legacy_su_config_is_the_same_model(tmp_path: Path) -> None:
    """transformers 4's Phi-3 form: rope_scaling {type: "su", ...} and original_max_position_embeddings
    at the top level; the same config and logits as the reference's rope_parameters."""
    def legacy(c: dict[str, Any]) -> None:
        params = c.pop("rope_parameters")
        c["rope_theta"] = params.pop("rope_theta")
        del params["rope_type"], params["original_max_position_embeddings"]
        c["rope_scaling"] = {**params, "type": "su"}

    new, old = larql.load(REFS / "phi3_longrope"), larql.load(_copy(tmp_path, "phi3_longrope", legacy))
    assert old.config == new.config and old.config.rope_scaling == "longrope"
    assert new.config.rope_factor == 4.0 and new.config.rope_original_context == 32
    assert abs(new.config.rope_attn_factor - (1 + np.log(4.0) / np.log(32.0)) ** 0.5) < 1e-12
    ids = np.load(REFS / "phi3_longrope.npz")["p0.ids"]
    assert np.array_equal(old.forward(ids), new.forward(ids))


@pytest.mark.parametrize("change, message", [
    (lambda p: p.update(short_factor=[1.0, 2.0]), r"rope_parameters\.short_factor must list 4 positive numbers"),
    (lambda p: p.pop("long_factor"), r"rope_parameters\.long_factor must list 4 positive numbers"),
    (lambda p: p.update(long_factor=[1.0, 0.0, 1.0, 1.0]), r"rope_parameters\.long_factor must list 4 positive numbers"),
])
def test_longrope_bad_factors(tmp_path: Path, change: Callable[[dict[str, Any]], None], message: str) -> None:
    d = _copy(tmp_path, "phi3_longrope", lambda c: change(c["rope_parameters"]))
    with pytest.raises(ModelFormatError, match=rf"phi3_longrope/config\.json: {message}"):
        larql.load(d)


def test_longrope_explicit_factors_are_read(tmp_path: Path) -> None:
    d = _copy(tmp_path, "phi3_longrope", lambda c: c["rope_parameters"].update(factor=2.0, attention_factor=1.5))
    cfg = larql.load(d).config
    assert (cfg.rope_factor, cfg.rope_attn_factor) == (2.0, 1.5)


def test_legacy_rope_scaling_is_read_too(tmp_path: Path) -> None:
    """transformers 4's rope_theta + rope_scaling say the same as rope_parameters, and give the same logits."""
    def legacy(c: dict[str, Any]) -> None:
        params = c.pop("rope_parameters")
        c["rope_theta"] = params.pop("rope_theta")
        kind = params.pop("rope_type")
        c["rope_scaling"] = {**params, "type": kind}

    new, old = larql.load(REFS / "llama3"), larql.load(_copy(tmp_path, "llama3", legacy))
    assert old.config == new.config and old.config.rope_scaling == "llama3"
    with pytest.raises(UnsupportedError, match=r"rope_scaling\.rope_type = 'yarn'"):
        larql.load(_copy(tmp_path / "y", "llama3", lambda c: (legacy(c), c["rope_scaling"].update(type="yarn"))))


def test_llama3_rope_missing_parameter(tmp_path: Path) -> None:
    d = _copy(tmp_path, "llama3", lambda c: c["rope_parameters"].pop("low_freq_factor"))
    with pytest.raises(ModelFormatError,
                       match=r"rope_parameters\.low_freq_factor is None; rope_type llama3 needs a number"):
        larql.load(d)


def test_partial_rotary_refused(tmp_path: Path) -> None:
    d = _copy(tmp_path, "phi3", lambda c: c["rope_parameters"].update(partial_rotary_factor=0.75))
    with pytest.raises(UnsupportedError, match=r"phi3/config\.json: partial_rotary_factor = 0\.75 is not supported"):
        larql.load(d)


def test_missing_field(tmp_path: Path) -> None:
    d = _copy(tmp_path, "qwen2", lambda c: c.pop("num_hidden_layers"))
    with pytest.raises(ModelFormatError, match=r"qwen2/config\.json: missing field 'num_hidden_layers', "
                                               r"which a qwen2 config must have"):
        larql.load(d)


def test_bad_field_value(tmp_path: Path) -> None:
    d = _copy(tmp_path, "mistral", lambda c: c.update(hidden_size="32"))
    with pytest.raises(ModelFormatError, match=r"field 'hidden_size' is '32'; expected a non-negative integer"):
        larql.load(d)


@pytest.mark.parametrize(("arch", "field", "value"), [
    ("llama3", "hidden_act", "relu"), ("llama3", "mlp_bias", True),
    ("gpt2", "scale_attn_by_inverse_layer_idx", True), ("gpt2", "activation_function", "relu"),
    ("gemma2", "layer_types", ["chunked_attention"] * 3), ("gemma3", "use_bidirectional_attention", True),
])
def test_unsupported_field_values(tmp_path: Path, arch: str, field: str, value: Any) -> None:
    d = _copy(tmp_path, arch, lambda c: c.update({field: value}))
    with pytest.raises(UnsupportedError, match=rf"{arch}/config\.json: {field} = .* is not supported; larql runs"):
        larql.load(d)


def test_wrong_tensor_shape(tmp_path: Path) -> None:
    def shrink(t: dict[str, np.ndarray]) -> None:
        t["model.layers.1.self_attn.k_proj.weight"] = t["model.layers.1.self_attn.k_proj.weight"][:8]

    d = _copy(tmp_path, "qwen3", tensors=shrink)
    with pytest.raises(ModelFormatError, match=r"qwen3: tensor model\.layers\.1\.self_attn\.k_proj\.weight has shape "
                                               r"\[8, 32\], the config implies \[32, 32\]"):
        larql.load(d)


def test_wrong_bias_shape(tmp_path: Path) -> None:
    def shrink(t: dict[str, np.ndarray]) -> None:
        t["model.layers.0.self_attn.q_proj.bias"] = t["model.layers.0.self_attn.q_proj.bias"][:5]

    with pytest.raises(ModelFormatError,
                       match=r"tensor blk\.0\.attn_q\.bias has shape \[5\], the config implies \[32\]"):
        larql.load(_copy(tmp_path, "qwen2", tensors=shrink))


def test_missing_tensor(tmp_path: Path) -> None:
    d = _copy(tmp_path, "gemma2", tensors=lambda t: t.pop("model.layers.2.mlp.up_proj.weight"))
    with pytest.raises(ModelFormatError, match=r"gemma2: missing tensor model\.layers\.2\.mlp\.up_proj\.weight"):
        larql.load(d)


def test_unknown_tensor_is_not_ignored(tmp_path: Path) -> None:
    """A checkpoint tensor the forward pass would not read is an error, not silently dropped."""
    d = _copy(tmp_path, "mistral", tensors=lambda t: t.update({"model.layers.0.mlp.extra_gate.weight":
                                                               np.zeros((4, 4), np.float32)}))
    with pytest.raises(ModelFormatError, match=r"mistral: tensor model\.layers\.0\.mlp\.extra_gate\.weight \(1 unread "
                                               r"in all\) has no place in a mistral model"):
        larql.load(d)


def test_gguf_rope_freqs_of_the_wrong_size_refused(tmp_path: Path) -> None:
    """llama.cpp stores Llama 3.1 rope scaling as a rope_freqs tensor of head_dim / 2 factors
    (tests/parity/test_architectures_gguf.py runs it); one of another size is refused, not guessed at."""
    import gguf

    from tests.synthetic import TinySpec, hf_weights, write_gguf

    spec = TinySpec("llama")
    path = tmp_path / "l31.gguf"
    held = hf_weights(spec)
    # write_gguf only knows HF names; add the extra tensor through a second writer pass
    write_gguf(path, spec, held)
    reader = gguf.GGUFReader(str(path))
    writer = gguf.GGUFWriter(str(tmp_path / "with_freqs.gguf"), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        writer.add_key_value(field.name, field.contents(), field.types[0],
                             field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data).reshape(list(reversed(t.shape.tolist()))))
    writer.add_tensor("rope_freqs.weight", np.ones(spec.head_dim, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFormatError, match=rf"with_freqs\.gguf: tensor rope_freqs\.weight must hold "
                                               rf"{spec.head_dim // 2} positive factors .* not {spec.head_dim} values"):
        larql.load(tmp_path / "with_freqs.gguf")
