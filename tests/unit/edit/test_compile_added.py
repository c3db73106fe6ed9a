"""COMPILE of features METHOD NEURON added to layers (overlay ids from a layer's width up): every
format writes every layer W = base width + the most any layer adds, rounded up to 256, features wide
(added ones at their ids, zero features elsewhere), and the compiled model gives the edited model's
logits: reopened as a vindex, loaded by larql from GGUF or safetensors, run by llama.cpp and by
transformers. The base vindex is not touched."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import gguf
import numpy as np
import pytest

import larql
from larql.edit.bake.compile import compile_gguf, compile_safetensors, compile_vindex
from larql.edit.bake.widen import ffn_width
from larql.edit.patches.overlay import FeatureOverride, MetaOverride, PatchOverlay
from larql.edit.state.view import EditableVindex, edit_vindex
from larql.errors import VindexError
from larql.model.gguf_file import GGUFFile
from larql.vindex.extract import extract
from larql.vindex.store import open_vindex
from tests.conftest import rel_err
from tests.synthetic import TinySpec, hf_weights, tiny_vindex, write_gguf

IDS = [5, 80, 81, 120, 7, 7, 9]
ADDED = {1: 3, 2: 5}  # layer -> features added; layer 2's third is removed again, leaving a hole


def add_features(v: EditableVindex, seed: int = 0) -> dict[int, list[int]]:
    """Random whole features, large enough to move the logits, on two layers (a hole in the second),
    a metadata override on one of them, and beside them a base feature deleted and a weight edit
    (ROME's W_down + U V^T, over the base features only). Returns the ids kept."""
    rng = np.random.default_rng(seed)
    for layer, n in ADDED.items():
        for _ in range(n):
            g, u, d = (rng.standard_normal(v.hidden).astype(np.float32) for _ in range(3))
            v.overlay.set(layer, v.overlay.next_feature(layer), FeatureOverride(g, u, d))
    width = v.overlay.widths[2]
    v.overlay.remove(2, width + 2)
    v.overlay.set_meta(1, v.overlay.widths[1], MetaOverride((65, 66), (0.9, 0.4)))
    v.overlay.delete(2, 4)
    u, w = rng.standard_normal((v.hidden, 1)).astype(np.float32), rng.standard_normal((v.overlay.widths[2], 1)).astype(np.float32)
    v.overlay.add_weight(2, 0.1 * u, w, w)
    return {layer: sorted(v.overlay.added(layer)) for layer in ADDED}


def base_files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir()}


def close(got: np.ndarray, want: np.ndarray) -> bool:
    """The compile tests' tolerance: within 1e-4 of the largest logit."""
    return bool(np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want)))


@pytest.fixture(scope="module", params=["gemma3", "llama"])
def edited(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny Q8_0 model (ffn 96) extracted to a vindex, with features added over an editable view."""
    root = tmp_path_factory.mktemp(f"added-{request.param}")
    vx = tiny_vindex(root, TinySpec(request.param, n_layers=4, ffn=96), seed=3)
    before = base_files(vx)
    v = edit_vindex(vx)
    base = v.model().forward(IDS).copy()
    kept = add_features(v)
    live = v.model().forward(IDS)
    assert np.max(np.abs(live - base)) > 0.05 * np.max(np.abs(base))  # the edit matters
    return {"vindex": vx, "v": v, "base": base, "live": live, "kept": kept, "before": before, "root": root}


def test_the_width_is_the_base_plus_the_most_added_rounded_up_to_256() -> None:
    index = {"intermediate_size": 96, "model_config": {"n_experts": 0}}
    o = PatchOverlay(4, 96, 8)
    assert ffn_width(o, index) == 96  # nothing added: nothing widened, not even rounded
    one = FeatureOverride(*(np.ones(8, np.float32) for _ in range(3)))
    o.set(1, 96, one)
    assert ffn_width(o, index) == 256
    o.set(2, 96 + 160, one)  # a hole of 160 ids below it counts: ids are kept
    assert ffn_width(o, index) == 512
    o.remove(2, 96 + 160)
    assert ffn_width(o, index) == 256
    with pytest.raises(VindexError, match="mixture-of-experts model cannot hold"):
        ffn_width(o, {"intermediate_size": 96, "model_config": {"n_experts": 4}})


def test_a_compiled_vindex_carries_the_added_features(edited: dict, tmp_path: Path) -> None:
    v, kept = edited["v"], edited["kept"]
    report = compile_vindex(v, tmp_path / "c.vindex")
    assert report.ffn_width == 256 and report.layers_rewritten == (1, 2)
    baked = open_vindex(report.path)
    assert baked.verify() == []
    assert baked.index["intermediate_size"] == baked.index["model_config"]["ffn"] == 256
    assert [baked.num_features(layer) for layer in range(4)] == [256] * 4
    for layer, ids in kept.items():
        gates = baked.gate_vectors(layer)
        for f in ids:
            assert np.array_equal(gates[f], v.overlay.added(layer)[f].gate)
        pads = [f for f in range(96, 256) if f not in ids]
        assert not np.any(gates[pads]) and not np.any(baked.down_meta(layer)[0][pads])
    assert baked.feature_meta(1, 96).token_ids[:2] == (65, 66)  # the added feature's metadata
    assert not np.any(baked.gate_vectors(2)[4])  # the deleted base feature stays deleted
    m = larql.load(report.path)
    assert m.config.ffn == 256
    assert m.weights.layers[0].down.qtype.name == "Q8_0" and m.weights.layers[0].down.shape == (64, 256)
    assert m.weights.layers[1].down.qtype.name == "F32" and m.weights.layers[1].gate.shape == (256, 64)
    assert close(m.forward(IDS), edited["live"])
    assert close(edit_vindex(report.path).model().forward(IDS), edited["live"])  # reopened for editing too
    assert base_files(edited["vindex"]) == edited["before"]  # the base is untouched


def with_a_merge(src: Path, out: Path) -> Path:
    """`src` with one BPE merge added: the tiny vocabulary has none, and llama.cpp refuses a BPE
    tokenizer without merges (the tensors are copied as they are)."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(out), str(r.fields["general.architecture"].contents()))
    for f in r.fields.values():
        if not f.name.startswith("GGUF.") and f.name != "general.architecture":
            w.add_key_value(f.name, f.contents(), f.types[0], f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    w.add_token_merges(["a b"])
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_a_compiled_gguf_runs_the_added_features_in_larql_and_llama_cpp(edited: dict, tmp_path: Path) -> None:
    report = compile_gguf(edited["v"], tmp_path / "c.gguf")
    assert report.ffn_width == 256
    g = GGUFFile(report.path)
    arch = g.metadata["general.architecture"]
    assert g.metadata[f"{arch}.feed_forward_length"] == 256
    assert g.tensors["blk.0.ffn_down.weight"].qtype.name == "Q8_0" and g.tensors["blk.2.ffn_up.weight"].qtype.name == "F32"
    m = larql.load(report.path)
    assert m.config.ffn == 256 and close(m.forward(IDS), edited["live"])
    assert base_files(edited["vindex"]) == edited["before"]
    if importlib.util.find_spec("llama_cpp") is None:
        return  # the peer is a dev tool, not in CI: what larql itself loads is checked above
    import llama_cpp

    from larql.cli.benchmark import llama_last_logits

    llm = llama_cpp.Llama(model_path=str(with_a_merge(report.path, tmp_path / "lc.gguf")), n_ctx=32, n_threads=1,
                          verbose=False)
    llm.eval(IDS)
    theirs, live, base = llama_last_logits(llm), edited["live"][-1], edited["base"][-1]
    # llama.cpp quantizes activations against Q8_0 weights: close (0.1 of a logit), not exact, and far
    # closer to the edited model than the edit is to the base
    assert np.max(np.abs(theirs - live)) < 0.1 * np.max(np.abs(live - base))
    assert int(np.argmax(theirs)) == int(np.argmax(live))


def test_a_gguf_compiled_without_its_source_states_the_width(tmp_path: Path) -> None:
    vx = tiny_vindex(tmp_path, TinySpec("gemma3", n_layers=3, ffn=96), seed=5)
    (tmp_path / "m.gguf").rename(tmp_path / "away.gguf")  # metadata rebuilt from the vindex
    v = edit_vindex(vx)
    add_features(v, seed=2)
    report = compile_gguf(v, tmp_path / "c.gguf")
    assert GGUFFile(report.path).metadata["gemma3.feed_forward_length"] == 256
    assert close(larql.load(report.path).forward(IDS), v.model().forward(IDS))


def test_compiled_safetensors_carry_the_added_features(edited: dict, tmp_path: Path) -> None:
    from safetensors import safe_open

    report = compile_safetensors(edited["v"], tmp_path / "hf", dtype="f32")
    assert report.ffn_width == 256
    assert json.loads((report.path / "config.json").read_text())["intermediate_size"] == 256
    with safe_open(str(report.path / "model.safetensors"), "np") as f:
        for i in range(4):
            p = f"model.layers.{i}.mlp."
            assert f.get_slice(p + "gate_proj.weight").get_shape() == [256, 64]
            assert f.get_slice(p + "up_proj.weight").get_shape() == [256, 64]
            assert f.get_slice(p + "down_proj.weight").get_shape() == [64, 256]
    assert close(larql.load(report.path).forward(IDS), edited["live"])
    assert base_files(edited["vindex"]) == edited["before"]
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        return  # the peer is a dev tool, not in CI: what larql itself loads is checked above
    import torch
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(report.path), dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.tensor([IDS])).logits[0].numpy()
    assert close(theirs, edited["live"])


def test_k_quant_rows_stay_whole_blocks(tmp_path: Path) -> None:
    """A Q4_K / Q6_K vindex (ffn 256): untouched layers keep their blocks with zero blocks appended
    (W = 512, whole 256-weight blocks), which decode to exact zeros."""
    spec = TinySpec("llama", n_layers=3, hidden=256, ffn=256, head_dim=64)
    write_gguf(tmp_path / "m.gguf", spec, hf_weights(spec, seed=9))
    vx = extract(tmp_path / "m.gguf", tmp_path / "q.vindex", level="inference", dtype="f32", quant="q4k")
    v = edit_vindex(vx)
    add_features(v, seed=4)
    live = v.model().forward(IDS)
    report = compile_vindex(v, tmp_path / "c.vindex")
    assert report.ffn_width == 512
    src, out = larql.load(vx).weights.layers[0], larql.load(report.path).weights.layers[0]
    for part in ("gate", "up", "down"):
        a, b = getattr(src, part), getattr(out, part)
        assert b.qtype == a.qtype and b.qtype.name in ("Q4_K", "Q6_K"), part
        values = b.dequantize()
        if part == "down":
            assert b.shape == (256, 512) and np.array_equal(values[:, :256], a.dequantize()) and not np.any(values[:, 256:])
        else:
            assert b.shape == (512, 256) and np.array_equal(values[:256], a.dequantize()) and not np.any(values[256:])
    assert close(larql.load(report.path).forward(IDS), live)
    gg = compile_gguf(v, tmp_path / "c.gguf")
    assert GGUFFile(gg.path).tensors["blk.0.ffn_down.weight"].qtype == src.down.qtype
    assert close(larql.load(gg.path).forward(IDS), live)


@pytest.mark.parametrize("arch", ["phi3", "gpt2"])
def test_fused_and_biased_architectures_widen_too(arch: str, tmp_path: Path) -> None:
    """Phi-3's fused gate/up and GPT-2's fully connected layer with its bias (zero for new features;
    GPT-2's down bias, per hidden unit, is left alone by the deleted feature)."""
    from tests.parity.test_architectures_gguf import write_gguf as write_arch_gguf

    src = write_arch_gguf(arch, tmp_path / "src.gguf")
    vx = extract(src, tmp_path / "v.vindex", level="inference", dtype="f32")
    v = edit_vindex(vx)
    base = v.model().forward(IDS).copy()
    add_features(v, seed=6)
    live = v.model().forward(IDS)
    assert rel_err(live, base) > 1e-2
    gg = compile_gguf(v, tmp_path / "c.gguf")
    g = GGUFFile(gg.path)
    assert g.metadata[f"{arch}.feed_forward_length"] == 256
    fused = g.tensors["blk.1.ffn_up.weight"]
    assert fused.shape == ((512 if arch == "phi3" else 256), 32)  # Phi-3: gate rows then up rows
    if arch == "gpt2":
        assert g.tensors["blk.1.ffn_up.bias"].shape == (256,)
    for out in (gg.path, compile_vindex(v, tmp_path / "c.vindex").path,
                compile_safetensors(v, tmp_path / "hf", dtype="f32").path):
        assert close(larql.load(out).forward(IDS), live), out


def test_diff_reads_a_vindex_compiled_wider(edited: dict, tmp_path: Path) -> None:
    """DIFF compares the two at the wider width: base -> compiled gives inserts past the base's width
    (added features) whose patch reproduces the compiled model; compiled -> the edits it came from:
    nothing differs."""
    from larql.edit.maintain.diff import diff, write_diff_patch

    baked = compile_vindex(edited["v"], tmp_path / "c.vindex").path
    base = edit_vindex(edited["vindex"])
    report = diff(base, edit_vindex(baked))
    added = {(r.layer, r.feature) for r in report.rows if r.feature >= 96}
    assert added == {(layer, f) for layer, ids in edited["kept"].items() for f in ids}
    assert {r.status for r in report.rows if r.feature >= 96} == {"added"}
    patch = write_diff_patch(base, report, tmp_path / "d.vlp")
    fresh = edit_vindex(edited["vindex"])
    fresh.patches.apply(patch)
    assert close(fresh.model().forward(IDS), edited["live"])
    assert diff(edit_vindex(baked), edited["v"]).rows == []
