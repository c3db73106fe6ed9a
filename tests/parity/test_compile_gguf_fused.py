"""COMPILE ... FORMAT GGUF of the architectures llama.cpp stores fused (Phi-3, GPT-2): the compiled
file has the source GGUF's tensor names (`attn_qkv`, `ffn_up` holding gate then up; GPT-2's fully
connected layer as `ffn_up`), quantized parts joined as their stored blocks, edited parts as float32,
and it loads back to the model it was compiled from."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import larql
from larql.lql.executor import execute
from larql.model.gguf_file import GGUFFile
from larql.vindex.extract import extract
from tests.conftest import rel_err
from tests.parity.test_architectures_gguf import write_gguf

REFS = Path(__file__).resolve().parents[1] / "golden" / "architectures"


def _q8(src: Path, out: Path) -> Path:
    """`src` with every 2-D tensor quantized to Q8_0 (the metadata as it is)."""
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(out), str(reader.fields["general.architecture"].contents()))
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), field.types[0], sub)
    for t in reader.tensors:
        data = np.array(t.data, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
        if data.ndim == 2 and data.shape[1] % 32 == 0:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.mark.parametrize("arch", ["phi3", "gpt2"])
def test_compiled_gguf_keeps_llama_cpps_fused_layout(arch: str, tmp_path: Path) -> None:
    src = _q8(write_gguf(arch, tmp_path / "f32.gguf"), tmp_path / "q8.gguf")
    vx = extract(src, tmp_path / "v.vindex", level="inference", dtype="f32")
    out = tmp_path / "out.gguf"
    execute(f'USE "{vx}"; COMPILE CURRENT INTO MODEL "{out}" FORMAT GGUF')
    theirs, ours = GGUFFile(src), GGUFFile(out)
    assert sorted(ours.tensors) == sorted(theirs.tensors)
    for name, info in theirs.tensors.items():  # unedited: the same blocks, joined as they were
        assert ours.tensors[name].qtype == info.qtype, name
        assert np.array_equal(ours.matrix(name).raw, theirs.matrix(name).raw), name
    ref = np.load(REFS / f"{arch}.npz")
    assert np.array_equal(larql.load(out).forward(ref["p0.ids"]), larql.load(src).forward(ref["p0.ids"]))


def test_an_edited_phi3_compiles_to_the_same_model(tmp_path: Path) -> None:
    """A feature INSERT rewrites a layer's gate and up as float32: that layer's fused ffn_up is
    float32, the others keep their Q8_0 blocks, and the GGUF runs as the edit baked into a vindex."""
    src = _q8(write_gguf("phi3", tmp_path / "f32.gguf"), tmp_path / "q8.gguf")
    vx = extract(src, tmp_path / "v.vindex", level="inference", dtype="f32")
    out, baked = tmp_path / "out.gguf", tmp_path / "baked.vindex"
    execute(f'USE "{vx}"; INSERT INTO EDGES (entity, relation, target) VALUES ("B", "x", "q") AT LAYER 1 '
            f'METHOD FEATURE; COMPILE CURRENT INTO MODEL "{out}" FORMAT GGUF; COMPILE CURRENT INTO VINDEX "{baked}"')
    g = GGUFFile(out)
    assert g.tensors["blk.1.ffn_up.weight"].qtype.name == "F32" and g.tensors["blk.0.ffn_up.weight"].qtype.name == "Q8_0"
    m = larql.load(out)
    ids = m.tokenize("The x of B is")
    assert rel_err(m.forward(ids), larql.load(baked).forward(ids)) <= 1e-6
    assert rel_err(m.forward(ids), larql.load(src).forward(ids)) > 1e-3


@pytest.mark.parametrize("arch", ["gemma2_gguf", "mistral", "mixtral", "phi3", "phi3_longrope", "gpt2", "qwen2"])
def test_an_hf_vindex_compiles_to_gguf_without_a_source(arch: str, tmp_path: Path) -> None:
    """A vindex extracted from an HF directory has no source GGUF: its metadata is rebuilt (Mistral
    and Mixtral as llama.cpp's llamas, q/k rows interleaved; Gemma 2's soft-caps; Phi-3's longrope
    keys and factor tensors; GPT-2's LayerNorm epsilon) and the file gives transformers' logits."""
    vx = extract(REFS / arch, tmp_path / "v.vindex", level="inference", dtype="f32")
    out = tmp_path / "out.gguf"
    execute(f'USE "{vx}"; COMPILE CURRENT INTO MODEL "{out}" FORMAT GGUF')
    m, hf = larql.load(out), larql.load(REFS / arch)
    want = {"mistral": "llama", "mixtral": "llama"}.get(hf.config.arch, hf.config.arch)
    assert GGUFFile(out).metadata["general.architecture"] == want
    assert (m.config.n_experts, m.config.sliding_window, m.config.final_softcap, m.config.rope_scaling) == (
        hf.config.n_experts, hf.config.sliding_window, hf.config.final_softcap, hf.config.rope_scaling)
    ref = np.load(REFS / f"{arch}.npz")
    for p in ("p0", "p1"):
        logits = m.forward(ref[f"{p}.ids"])
        assert rel_err(logits, ref[f"{p}.logits"]) <= 1e-4
        assert np.array_equal(logits.argmax(-1), ref[f"{p}.logits"].argmax(-1))


def test_a_gemma2_query_scale_gguf_cannot_state_is_refused(tmp_path: Path) -> None:
    from larql.errors import LqlSemanticError

    vx = extract(REFS / "gemma2", tmp_path / "v.vindex", level="inference", dtype="f32")
    with pytest.raises(LqlSemanticError, match=r"this Gemma 2 scales queries by 0\.288675, which a GGUF cannot state "
                                               r"\(llama\.cpp derives 0\.353553\)"):
        execute(f'USE "{vx}"; COMPILE CURRENT INTO MODEL "{tmp_path / "o.gguf"}" FORMAT GGUF')
