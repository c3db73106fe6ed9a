"""COMPILE ... INTO MODEL "dir" FORMAT SAFETENSORS: HF names, shapes and conventions (llama q/k rows
un-permuted, Gemma norms back to `w`), edits baked in, and a round trip through larql's HF loader."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

import larql
from larql.edit.bake.compile import compile_safetensors
from larql.edit.patches.patch import PatchOp
from larql.edit.patches.weight_op import WeightOp
from larql.edit.state.view import edit_vindex
from larql.errors import LqlSemanticError, ModelError, VindexError
from larql.lql.executor import execute
from larql.lql.session import Session
from larql.vindex.extract import extract
from tests.synthetic import TinySpec, hf_weights, write_gguf

IDS = [5, 80, 81, 120, 7, 7, 9]


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n])


def _tensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny model as a Q8_0 GGUF (llama q/k rows permuted, Gemma norms + 1), extracted to a vindex,
    with the HF-convention weights the GGUF actually holds."""
    spec = TinySpec(request.param, n_layers=4)
    root = tmp_path_factory.mktemp(f"st-{spec.arch}")
    held = write_gguf(root / "m.gguf", spec, hf_weights(spec, seed=3), gguf.GGMLQuantizationType.Q8_0)
    vx = extract(root / "m.gguf", root / "t.vindex", level="inference", dtype="f32")
    return {"spec": spec, "held": held, "vindex": vx, "root": root}


def test_names_shapes_and_conventions_match_the_hf_checkpoint(tiny: dict, tmp_path: Path) -> None:
    out = compile_safetensors(edit_vindex(tiny["vindex"]), tmp_path / "hf", dtype="f32").path
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                    "tokenizer.json", "tokenizer_config.json"]
    header = _header(out / "model.safetensors")
    assert header.pop("__metadata__") == {"format": "pt"}
    held = tiny["held"]
    assert {k: v["shape"] for k, v in header.items()} == {k: list(v.shape) for k, v in held.items()}
    got = _tensors(out / "model.safetensors")
    for name, want in held.items():  # exact: un-permuted q/k rows, Gemma norms minus 1, Q8_0 dequantized
        np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-6 if "norm" in name else 0, err_msg=name)
    config = json.loads((out / "config.json").read_text())
    spec = tiny["spec"]
    arch = {"llama": "LlamaForCausalLM", "gemma3": "Gemma3ForCausalLM"}[spec.arch]
    assert config["architectures"] == [arch] and config["num_hidden_layers"] == 4
    assert (config["num_key_value_heads"], config["head_dim"], config["vocab_size"]) == (2, 16, 257)
    if spec.arch == "gemma3":
        assert config["layer_types"] == ["sliding_attention", "full_attention"] * 2
        assert config["query_pre_attn_scalar"] == 16 and config["sliding_window"] == 4
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast" and tok_config["eos_token"] == "<|endoftext|>"
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 256


def test_round_trip_through_larqls_hf_loader_keeps_the_edits(tiny: dict, tmp_path: Path) -> None:
    v = edit_vindex(tiny["vindex"])
    rng = np.random.default_rng(1)
    spec = tiny["spec"]
    v.patches.record(PatchOp("insert", 1, 30, {"gate": rng.standard_normal(spec.hidden).astype(np.float32),
                                               "down": rng.standard_normal(spec.hidden).astype(np.float32)}))
    v.patches.record(PatchOp("delete", 3, 9, {}))
    u, w = rng.standard_normal((spec.hidden, 2)).astype(np.float32), rng.standard_normal((spec.ffn, 2)).astype(np.float32)
    v.patches.record(WeightOp(2, 0.1 * u, w, w))
    live = v.model().forward(IDS)
    base = larql.load(tiny["vindex"]).dense().forward(IDS)
    report = compile_safetensors(v, tmp_path / "hf", dtype="f32")
    assert report.layers_rewritten == (1, 2, 3) and report.edited_features == 2
    back = larql.load(report.path)
    assert back.config.rope_interleaved is False  # HF layout: the rows were un-permuted, not flagged
    out = back.forward(IDS)
    assert np.max(np.abs(out - live)) <= 1e-4 * np.max(np.abs(live))
    assert np.max(np.abs(out - base)) > 1e-2  # the edits are in the weights, not lost
    assert back.tokenize("hello there") == v.model().tokenize("hello there")


def test_lql_compile_writes_bf16_by_default_and_refuses_an_existing_output(tiny: dict, tmp_path: Path) -> None:
    s = Session()
    out = tmp_path / "edited"
    res = execute(f'USE "{tiny["vindex"]}"; COMPILE CURRENT INTO MODEL "{out}" FORMAT SAFETENSORS', s)[-1]
    assert "transformers" in res.notes[0]
    assert {v["dtype"] for k, v in _header(out / "model.safetensors").items() if k != "__metadata__"} == {"BF16"}
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    dense = larql.load(tiny["vindex"]).dense().forward(IDS)
    bf16 = larql.load(out).forward(IDS)
    err = np.max(np.abs(bf16 - dense)) / np.max(np.abs(dense))
    assert 0 < err < 0.02  # bf16 keeps 8 significant bits: close, not exact
    with pytest.raises(LqlSemanticError, match="already exists"):
        execute(f'COMPILE CURRENT INTO MODEL "{out}" FORMAT SAFETENSORS', s)
    # no FORMAT: a directory target means safetensors
    execute(f'COMPILE CURRENT INTO MODEL "{tmp_path / "plain"}"', s)
    assert (tmp_path / "plain" / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edited", "plain"]  # no temporary left behind


def test_lql_compile_dtype_chooses_the_encoding(tiny: dict, tmp_path: Path) -> None:
    s = Session()
    execute(f'USE "{tiny["vindex"]}"', s)
    dense = larql.load(tiny["vindex"]).dense().forward(IDS)
    for dtype, st, torch_name in (("F32", "F32", "float32"), ("f16", "F16", "float16")):
        out = tmp_path / dtype
        execute(f'COMPILE CURRENT INTO MODEL "{out}" FORMAT SAFETENSORS DTYPE {dtype}', s)
        assert {v["dtype"] for k, v in _header(out / "model.safetensors").items() if k != "__metadata__"} == {st}
        assert json.loads((out / "config.json").read_text())["torch_dtype"] == torch_name
        err = np.max(np.abs(larql.load(out).forward(IDS) - dense)) / np.max(np.abs(dense))
        assert err < (1e-5 if st == "F32" else 2e-3), (dtype, err)
    with pytest.raises(LqlSemanticError, match="DTYPE applies to FORMAT SAFETENSORS") as e:
        execute(f'COMPILE CURRENT INTO MODEL "{tmp_path / "o.gguf"}" DTYPE F32', s)
    assert e.value.line == 1 and e.value.column == 1
    from larql.errors import LqlSyntaxError

    with pytest.raises(LqlSyntaxError, match="expected BF16, F16 or F32 after DTYPE, found 'f8'") as e:
        execute(f'COMPILE CURRENT INTO MODEL "{tmp_path / "x"}" DTYPE f8', s)
    assert e.value.column == len(f'COMPILE CURRENT INTO MODEL "{tmp_path / "x"}" DTYPE ') + 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["F32", "f16"]


def test_browse_vindex_and_bad_dtype_are_refused(tiny: dict, tmp_path: Path) -> None:
    browse = extract(tiny["root"] / "m.gguf", tmp_path / "b.vindex", level="browse")
    with pytest.raises(VindexError, match="browse-level vindex has no weights"):
        compile_safetensors(edit_vindex(browse), tmp_path / "x")
    with pytest.raises(ModelError, match="unknown dtype 'f8'"):
        compile_safetensors(edit_vindex(tiny["vindex"]), tmp_path / "x", dtype="f8")
    assert not (tmp_path / "x").exists()


def test_gemma3_270m_round_trip_in_bf16(gemma_vindex: Path, tmp_path: Path) -> None:
    """The real model: bf16 costs at most ~0.1 of a logit and keeps the top 5 (measured 0.088)."""
    report = compile_safetensors(edit_vindex(gemma_vindex), tmp_path / "g", dtype="bf16")
    config = json.loads((report.path / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["num_hidden_layers"] == 18
    assert config["layer_types"].count("full_attention") == 3 and config["query_pre_attn_scalar"] == 256
    src = larql.load(gemma_vindex).dense()
    back = larql.load(report.path)
    ids = src.tokenize("The capital of France is")
    assert back.tokenize("The capital of France is") == ids
    want, got = src.next_logits(ids), back.next_logits(ids)
    assert np.max(np.abs(got - want)) < 0.2
    assert list(np.argsort(-got)[:5]) == list(np.argsort(-want)[:5])
