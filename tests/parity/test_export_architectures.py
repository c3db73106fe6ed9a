"""Safetensors export of Gemma 2, Mixtral, Mistral, Qwen2, Qwen3, Phi-3 (longrope too), GPT-2 and
Llama 3 (export_model and COMPILE ... INTO MODEL FORMAT SAFETENSORS): the directory written is the HF
checkpoint transformers saved (the same tensor names), larql loads it back to the same config and
logits, from the HF reference, from its GGUF and from an edited vindex. That transformers itself
runs the export is a dev-only check (benchmarks/check_safetensors_export.py --dirs), not a test: no
torch here."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import larql
from larql.errors import UnsupportedError
from larql.lql.executor import execute
from larql.model.export_hf import export_model
from larql.model.generate import log_softmax
from larql.vindex.extract import extract
from tests.conftest import rel_err
from tests.parity.test_architectures_gguf import write_gguf

REFS = Path(__file__).resolve().parents[1] / "golden" / "architectures"


@pytest.mark.parametrize("arch, cls", [("gemma2", "Gemma2ForCausalLM"), ("mixtral", "MixtralForCausalLM"),
                                       ("mistral", "MistralForCausalLM"), ("qwen2", "Qwen2ForCausalLM"),
                                       ("qwen3", "Qwen3ForCausalLM"), ("llama3", "LlamaForCausalLM"),
                                       ("phi3", "Phi3ForCausalLM"), ("phi3_longrope", "Phi3ForCausalLM"),
                                       ("gpt2", "GPT2LMHeadModel")])
def test_export_is_the_checkpoint_transformers_saved(arch: str, cls: str, tmp_path: Path) -> None:
    m = larql.load(REFS / arch)
    out = export_model(m, tmp_path / arch, dtype="f32")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [cls]
    theirs, ours = load_file(str(REFS / arch / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():  # Gemma's norms back to w (larql holds 1 + w): equal to rounding
        np.testing.assert_allclose(ours[name], value, rtol=0, atol=1e-7, err_msg=name)
    back = larql.load(out)
    assert back.config == m.config
    ref = np.load(REFS / f"{arch}.npz")
    for p in ("p0", "p1"):
        logits = back.forward(ref[f"{p}.ids"])
        assert rel_err(logits, m.forward(ref[f"{p}.ids"])) <= 1e-6
        assert rel_err(logits, ref[f"{p}.logits"]) <= 1e-4
        assert np.array_equal(logits.argmax(-1), ref[f"{p}.logits"].argmax(-1))


@pytest.mark.parametrize("arch", ["gemma2_gguf", "mixtral", "qwen2", "qwen3", "phi3", "phi3_longrope", "gpt2"])
def test_export_from_gguf_gives_transformers_logits(arch: str, tmp_path: Path) -> None:
    """From llama.cpp's layout (Gemma norms 1 + w, Mixtral a llama with stacked experts and its q/k
    rows permuted): the export loads back to the reference's logits."""
    src = larql.load(write_gguf(arch, tmp_path / f"{arch}.gguf"))
    out = export_model(src, tmp_path / "hf", dtype="f32")
    back = larql.load(out)
    assert back.config.n_experts == src.config.n_experts and back.config.final_softcap == src.config.final_softcap
    ref = np.load(REFS / f"{arch}.npz")
    for p in ("p0", "p1"):
        logits = back.forward(ref[f"{p}.ids"])
        assert rel_err(logits, src.forward(ref[f"{p}.ids"])) <= 1e-6
        assert rel_err(logits, ref[f"{p}.logits"]) <= 1e-4


def test_compile_an_edited_moe_vindex_into_safetensors(tmp_path: Path) -> None:
    """An INSERT into an expert, compiled to safetensors: the export runs as the edited vindex."""
    vx = extract(REFS / "mixtral", tmp_path / "m.vindex", level="inference", dtype="f32")
    out = tmp_path / "edited"
    prompt = "The x of B is"
    res = execute(f'USE "{vx}"; INSERT INTO EDGES (entity, relation, target) VALUES ("B", "x", "q") AT LAYER 1 '
                  f'METHOD FEATURE; INFER "{prompt}" TOP 1; COMPILE CURRENT INTO MODEL "{out}" FORMAT SAFETENSORS '
                  f'DTYPE F32; COMPILE CURRENT INTO VINDEX "{tmp_path / "baked.vindex"}"')
    assert res[2].rows[0][2] >= 0.9  # the edited vindex answers the target
    back = larql.load(out)
    ids = back.tokenize(prompt)
    p = np.exp(log_softmax(back.next_logits(ids)))
    assert back.tokenizer.token_text(int(np.argmax(p))) == res[2].rows[0][1]
    assert float(p.max()) == pytest.approx(res[2].rows[0][2], abs=1e-4)
    baked = larql.load(tmp_path / "baked.vindex")  # the same edit baked into a vindex's expert weights
    assert rel_err(back.forward(ids), baked.forward(ids)) <= 1e-6
    assert rel_err(back.forward(ids), larql.load(REFS / "mixtral").forward(ids)) > 1e-3  # the edit is in the export


def test_what_the_export_cannot_carry_is_refused(tmp_path: Path) -> None:
    m = larql.load(REFS / "gemma2")
    m.config = replace(m.config, rope_base_local=1234.0)  # Gemma 2 has one rope base
    with pytest.raises(UnsupportedError, match="Gemma 2 has one rope base"):
        export_model(m, tmp_path / "x", dtype="f32")
    m = larql.load(REFS / "qwen2")
    m.config = replace(m.config, arch="bloom")
    with pytest.raises(UnsupportedError, match="safetensors export knows Gemma 2, Gemma 3, GPT-2, Llama, Mistral, "
                                               "Mixtral, Phi-3, Qwen2 and Qwen3, not 'bloom'"):
        export_model(m, tmp_path / "y", dtype="f32")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
