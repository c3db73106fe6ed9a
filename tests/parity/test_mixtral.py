"""Mixtral beyond the logits (those are in test_architectures.py): the experts fused as transformers
5 holds them load to the same model, the router is a hook point, and what larql cannot do with a
mixture of experts yet (a vindex, weight edits) is refused, not done wrongly."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import larql
from larql.errors import LqlSemanticError, UnsupportedError
from larql.lql.executor import execute
from larql.model.generate import log_softmax
from larql.model.hooks import Zero
from larql.model.targets import first_target_token
from larql.vindex.extract import extract
from tests.conftest import rel_err

REF = Path(__file__).resolve().parents[1] / "golden" / "architectures" / "mixtral"


def test_fused_experts_load_to_the_same_model(tmp_path: Path) -> None:
    m = larql.load(REF)
    t = load_file(str(REF / "model.safetensors"))
    fused: dict[str, np.ndarray] = {}
    for i in range(m.config.n_layers):
        p = f"model.layers.{i}.block_sparse_moe."
        experts = range(m.config.n_experts)
        fused[f"model.layers.{i}.mlp.gate.weight"] = t.pop(p + "gate.weight")
        fused[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([t.pop(f"{p}experts.{e}.w1.weight"), t.pop(f"{p}experts.{e}.w3.weight")]) for e in experts])
        downs = [t.pop(f"{p}experts.{e}.w2.weight") for e in experts]
        fused[f"model.layers.{i}.mlp.experts.down_proj"] = np.stack(downs)
    d = tmp_path / "fused"
    shutil.copytree(REF, d)
    save_file(t | fused, str(d / "model.safetensors"))
    ids = np.load(REF.parent / "mixtral.npz")["p1.ids"]
    assert np.array_equal(larql.load(d).forward(ids), m.forward(ids))


def test_router_hook_sees_and_steers_the_routing() -> None:
    m = larql.load(REF)
    ids = np.load(REF.parent / "mixtral.npz")["p1.ids"]
    _, cache = m.run_with_cache(ids, ["blocks.0.mlp.hook_router"])
    assert cache["blocks.0.mlp.hook_router"].shape == (len(ids), m.config.n_experts)
    # a router that prefers no expert still picks k of them: the output changes, nothing breaks
    assert not np.allclose(m.forward(ids, hooks={"blocks.0.mlp.hook_router": Zero()}), m.forward(ids))


@pytest.fixture(scope="module")
def vindex(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract(REF, tmp_path_factory.mktemp("moe") / "m.vindex", level="inference", dtype="f32")


def test_the_vindex_stores_each_experts_gates_and_down_meta(vindex: Path) -> None:
    """Layer L's block holds expert e's feature j at row e x ffn + j (FORMAT.md): its gate row
    exactly, and as down_meta the tokens its down column writes most (checked here by brute force)."""
    m = larql.load(REF)
    v = larql.open_vindex(vindex)
    unembed = m.weights.output.dequantize()  # (vocab, hidden)
    ffn = m.config.ffn
    for layer in range(m.config.n_layers):
        assert v.num_experts(layer) == 4 and v.num_features(layer) == 4 * ffn
        ids, scores = v.down_meta(layer)
        for e, (gate, _, down) in enumerate(m.weights.layers[layer].experts):
            assert np.array_equal(v.gate_vectors(layer)[e * ffn:(e + 1) * ffn], gate.dequantize())
            want = unembed @ down.dequantize()  # (vocab, ffn): every token's score per feature
            top = np.argsort(-want, axis=0, kind="stable")[: v.top_k].T  # (ffn, top_k)
            assert np.array_equal(ids[e * ffn:(e + 1) * ffn], top)
            assert np.allclose(scores[e * ffn:(e + 1) * ffn], np.take_along_axis(want.T, top, axis=1), atol=1e-5)
    assert v.feature_name(1, 2 * ffn + 17) == "L1 E2 F17"


def test_a_dense_vindex_is_written_as_before(tmp_path: Path) -> None:
    """A dense layer's entry has no num_experts (index.json as before this layout: byte-identical
    files, checked by hand against the previous writer), and its features are named as ever."""
    v = larql.open_vindex(extract(REF.parent / "llama3", tmp_path / "d.vindex"))
    assert all(set(e) == {"layer", "num_features", "gate_offset", "gate_length", "down_meta_offset",
                          "down_meta_length"} for e in v.index["layers"])
    assert v.num_experts(0) == 0 and v.feature_name(2, 17) == "L2 F17"


def test_walk_describe_infer_and_trace_on_the_moe_vindex(vindex: Path) -> None:
    ref = np.load(REF.parent / "mixtral.npz")
    assert rel_err(larql.load(vindex).forward(ref["p0.ids"]), ref["p0.logits"]) <= 1e-6
    walk, card, infer, trace = execute(f'USE "{vindex}"; WALK "The capital" TOP 2; DESCRIBE "a" VERBOSE; '
                                       f'INFER "Bees make honey" TOP 3; TRACE "Bees make honey"')[1:]
    assert len(walk.rows) == 6 and all(re.fullmatch(r"E[0-3] F\d+", row[1]) for row in walk.rows)
    assert card.title == "a" and card.notes
    direct = larql.load(REF)
    top = int(np.argmax(direct.next_logits(direct.tokenize("Bees make honey"))))
    assert infer.rows[0][1] == direct.tokenizer.token_text(top)
    assert [row[0] for row in trace.rows] == ["emb", "L0", "L1", "L2"]
    with pytest.raises(LqlSemanticError, match="EXPLAIN INFER ranks one FFN's activations .* mixtral's layers are a "
                                               "mixture of 4 experts"):
        execute(f'USE "{vindex}"; EXPLAIN INFER "Bees"')


def test_insert_targets_the_expert_the_router_picks(vindex: Path) -> None:
    """A feature insert at layer 1 takes its slot in the expert the router weighs most at the
    prompt's last position, and the model then answers the target; DELETE of that feature undoes it."""
    m = larql.load(REF)
    _, cache = m.run_with_cache(m.tokenize("The x of B is"), ["blocks.1.mlp.hook_router"])
    expert = int(np.argmax(cache["blocks.1.mlp.hook_router"][-1]))
    ins, after = execute(f'USE "{vindex}"; INSERT INTO EDGES (entity, relation, target) VALUES ("B", "x", "q") '
                         f'AT LAYER 1 METHOD FEATURE; INFER "The x of B is" TOP 1')[1:]
    found = re.search(r"at L1 E(\d) F(\d+) ", ins.title)
    assert found is not None and int(found[1]) == expert
    assert ins.rows[0][1] < 1e-3 and ins.rows[0][2] >= 0.9  # p(target) before and after
    assert after.rows[0][1] == m.tokenizer.token_text(first_target_token(m, "q")) and after.rows[0][2] >= 0.9
    flat = expert * m.config.ffn + int(found[2])
    compiled = vindex.parent / "compiled.vindex"
    execute(f'USE "{vindex}"; INSERT INTO EDGES (entity, relation, target) VALUES ("B", "x", "q") AT LAYER 1 '
            f'METHOD FEATURE; COMPILE CURRENT INTO VINDEX "{compiled}"')
    baked = larql.load(compiled)  # the edit in expert `expert`'s weights, no overlay
    p = np.exp(log_softmax(baked.next_logits(baked.tokenize("The x of B is"))))
    assert p[first_target_token(m, "q")] == pytest.approx(ins.rows[0][2], abs=1e-4)
    with pytest.raises(LqlSemanticError, match="REBALANCE re-tunes the facts of one dense FFN; layer 1 of mixtral is "
                                               "a mixture of 4 experts"):
        execute(f'USE "{vindex}"; INSERT INTO EDGES (entity, relation, target) VALUES ("B", "x", "q") AT LAYER 1 '
                f'METHOD FEATURE; REBALANCE')
    undone = execute(f'USE "{vindex}"; INSERT INTO EDGES (entity, relation, target) VALUES ("B", "x", "q") AT LAYER 1 '
                     f'METHOD FEATURE; DELETE FROM EDGES WHERE layer = 1 AND feature = {flat}; '
                     f'INFER "The x of B is" TOP 1')[-1]
    assert undone.rows[0][2] < 0.5


def test_weight_edits_on_experts_are_refused_before_any_work(vindex: Path) -> None:
    from larql.model.grad import Tail

    m = larql.load(REF)
    with pytest.raises(UnsupportedError, match="weight edits .* cannot run on mixtral: its mixture of experts"):
        Tail(m.config, m.weights, 1)
    with pytest.raises(LqlSemanticError, match=r"weight edits \(ROME/MEMIT\) cannot run on mixtral: its mixture of "
                                               r"experts has no backward pass in larql yet; use INSERT ... METHOD "
                                               r"FEATURE \(it takes a feature of the expert the router picks\)"):
        execute(f'USE "{vindex}"; INSERT INTO EDGES (entity, relation, target) VALUES ("B", "x", "q") METHOD ROME')


@pytest.mark.parametrize("arch", ["mixtral", "gpt2"])
def test_run_with_cache_captures_exactly_the_points_reached(arch: str) -> None:
    m = larql.load(REF.parent / arch)
    _, cache = m.run_with_cache(np.load(REF.parent / f"{arch}.npz")["p1.ids"])
    assert list(cache) == m.hook_names()
    assert ("blocks.0.mlp.hook_router" in cache) == (arch == "mixtral")
    assert ("blocks.0.attn.hook_rot_q" in cache) == (arch != "gpt2")


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def test_expert_hooks_match_a_recomputation_from_the_weights() -> None:
    """Per expert: `mlp.experts.E.hook_pre` (gate projection), `hook_post` (silu(gate) * up) and
    `hook_out` (down projection, before the router's weight) equal the expert's FFN computed in
    float64 from the checkpoint's w1 / w3 / w2 on the positions the router sends to it, and are zero
    elsewhere; weighted by the renormalised top-2 router probabilities they sum to `hook_mlp_out`,
    and that added to `hook_resid_mid` is transformers' residual after the layer."""
    m = larql.load(REF)
    ref = np.load(REF.parent / "mixtral.npz")
    t = load_file(str(REF / "model.safetensors"))
    ids, n_exp = ref["p0.ids"], m.config.n_experts
    for layer in range(m.config.n_layers):
        p = f"model.layers.{layer}."
        experts = [f"blocks.{layer}.mlp.experts.{e}.hook_{k}" for e in range(n_exp) for k in ("pre", "post", "out")]
        names = [f"blocks.{layer}.hook_resid_mid", f"blocks.{layer}.mlp.hook_router", *experts,
                 f"blocks.{layer}.hook_mlp_out"]
        _, cache = m.run_with_cache(ids, names)
        assert list(cache) == names  # in forward order: the router, then expert by expert
        x = cache[f"blocks.{layer}.hook_resid_mid"].astype(np.float64)
        h = x / np.sqrt((x * x).mean(-1, keepdims=True) + m.config.norm_eps) * t[p + "post_attention_layernorm.weight"]
        logits = h @ t[p + "block_sparse_moe.gate.weight"].T  # (T, experts)
        assert rel_err(cache[f"blocks.{layer}.mlp.hook_router"], logits) <= 1e-5
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        top = np.argsort(-probs, axis=1)[:, :2]  # (T, 2)
        mlp_out = np.zeros_like(h)
        for e in range(n_exp):
            w = f"{p}block_sparse_moe.experts.{e}."
            routed = (top == e).any(axis=1)  # (T,)
            assert routed.any() and not routed.all()  # the test sees both kinds of rows
            pre = h @ t[w + "w1.weight"].T
            post = _silu(pre) * (h @ t[w + "w3.weight"].T)
            out = post @ t[w + "w2.weight"].T
            for kind, want in (("pre", pre), ("post", post), ("out", out)):
                got = cache[f"blocks.{layer}.mlp.experts.{e}.hook_{kind}"]
                assert got.shape == want.shape
                assert rel_err(got[routed], want[routed]) <= 1e-5, f"layer {layer} expert {e} hook_{kind}"
                assert not got[~routed].any()
            weight = np.where(routed, probs[:, e], 0.0) / np.take_along_axis(probs, top, 1).sum(1)  # (T,)
            mlp_out += weight[:, None] * out
        assert rel_err(cache[f"blocks.{layer}.hook_mlp_out"], mlp_out) <= 1e-5
        assert rel_err(x + mlp_out, ref["p0.resid_post"][layer]) <= 1e-4  # transformers' own residual


def test_expert_hooks_match_transformers_experts() -> None:
    """Against transformers itself (tools/make_tiny_references.py runs Mixtral's experts module once
    per expert with weight 1 on that expert's slots): every expert's `hook_out` equals transformers'
    output of that expert, on both prompts and every layer, zero where neither picks it; the rows
    larql routes to each expert are the ones transformers' router chose."""
    m = larql.load(REF)
    ref = np.load(REF.parent / "mixtral.npz")
    for p in ("p0", "p1"):
        names = [f"blocks.{i}.mlp.experts.{e}.hook_out" for i in range(m.config.n_layers)
                 for e in range(m.config.n_experts)]
        _, cache = m.run_with_cache(ref[f"{p}.ids"], names)
        for i in range(m.config.n_layers):
            for e in range(m.config.n_experts):
                got, want = cache[f"blocks.{i}.mlp.experts.{e}.hook_out"], ref[f"{p}.expert_out"][i, e]
                chosen = (ref[f"{p}.expert_index"][i] == e).any(axis=1)  # (T,) transformers' routing
                assert np.array_equal(got.any(axis=1), chosen), f"{p} layer {i} expert {e}: routing"
                assert rel_err(got, want) <= 1e-5, f"{p} layer {i} expert {e}: {rel_err(got, want):.1e}"


def test_ablating_an_expert_by_its_hook_equals_zeroing_its_weights(tmp_path: Path) -> None:
    """Zero() on `blocks.1.mlp.experts.2.hook_out` (or its hook_post) gives exactly the logits of the
    checkpoint with that expert's w2 zeroed; at one position it changes only that position onwards."""
    m = larql.load(REF)
    ids = np.load(REF.parent / "mixtral.npz")["p0.ids"]
    t = load_file(str(REF / "model.safetensors"))
    t["model.layers.1.block_sparse_moe.experts.2.w2.weight"][:] = 0.0
    d = tmp_path / "zeroed"
    shutil.copytree(REF, d)
    save_file(t, str(d / "model.safetensors"))
    zeroed = larql.load(d).forward(ids)
    by_out = m.forward(ids, hooks={"blocks.1.mlp.experts.2.hook_out": Zero()})
    by_post = m.forward(ids, hooks={"blocks.1.mlp.experts.2.hook_post": Zero()})
    np.testing.assert_array_equal(by_out, zeroed)
    np.testing.assert_array_equal(by_post, zeroed)
    plain = m.forward(ids)
    assert rel_err(by_out, plain) > 1e-3
    _, cache = m.run_with_cache(ids, ["blocks.1.mlp.experts.2.hook_out"])
    pos = int(np.flatnonzero(cache["blocks.1.mlp.experts.2.hook_out"].any(axis=1))[3])  # a position it serves
    one = m.forward(ids, hooks={"blocks.1.mlp.experts.2.hook_out": Zero(positions=[pos])})
    np.testing.assert_array_equal(one[:pos], plain[:pos])
    assert rel_err(one[pos], plain[pos]) > 1e-4
    # through the KV cache, one token at a time, the hook addresses the same absolute position
    hooks = {"blocks.1.mlp.experts.2.hook_out": Zero(positions=[pos])}
    prompt = [int(i) for i in ids[:pos]]
    cache = m.new_cache(pos + 1)
    m.next_logits(prompt, cache, hooks=hooks)
    step = m.next_logits([int(ids[pos])], cache, hooks=hooks)  # position pos, its expert 2 ablated
    assert rel_err(step, one[pos]) <= 1e-5


def test_expert_hook_names_are_checked() -> None:
    from larql.errors import ModelError

    m = larql.load(REF)
    with pytest.raises(ModelError, match=r"hook 'blocks\.0\.mlp\.experts\.4\.hook_out': expert 4 is out of range "
                                         r"\(this model has experts 0-3\)"):
        m.forward([1, 2], hooks={"blocks.0.mlp.experts.4.hook_out": Zero()})
    with pytest.raises(ModelError, match=r"expert 0 is out of range \(this model has no experts\)"):
        larql.load(REF.parent / "llama3").forward([1, 2], hooks={"blocks.0.mlp.experts.0.hook_pre": Zero()})
    assert "blocks.0.mlp.experts.3.hook_out" in m.hook_names()
    assert not any(".experts." in n for n in larql.load(REF.parent / "llama3").hook_names())


def test_routing_hooks_are_transformers_routing_and_steer_it() -> None:
    """`mlp.hook_expert_weights` is the softmax of the router logits (TransformerLens's point, before
    the top-k) and `mlp.hook_expert_indices` the experts transformers' router chose, in its order;
    replacing the weights by a one-hot on expert 3 sends every position to expert 3 alone."""
    from larql.errors import ModelError
    from larql.model.hooks import Replace

    m = larql.load(REF)
    ref = np.load(REF.parent / "mixtral.npz")
    for p in ("p0", "p1"):
        ids = ref[f"{p}.ids"]
        for i in range(m.config.n_layers):
            names = [f"blocks.{i}.mlp.hook_router", f"blocks.{i}.mlp.hook_expert_weights",
                     f"blocks.{i}.mlp.hook_expert_indices"]
            _, cache = m.run_with_cache(ids, names)
            logits = cache[names[0]].astype(np.float64)
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            assert rel_err(cache[names[1]], probs / probs.sum(-1, keepdims=True)) <= 1e-6
            assert np.array_equal(cache[names[2]], ref[f"{p}.expert_index"][i])
    ids = ref["p1.ids"]
    one_hot = np.eye(m.config.n_experts, dtype=np.float32)[3]
    _, cache = m.run_with_cache(ids, ["blocks.1.mlp.experts.3.hook_out", "blocks.1.hook_mlp_out"],
                                hooks={"blocks.1.mlp.hook_expert_weights": Replace(one_hot)})
    np.testing.assert_array_equal(cache["blocks.1.hook_mlp_out"], cache["blocks.1.mlp.experts.3.hook_out"])
    assert cache["blocks.1.mlp.experts.3.hook_out"].any(axis=1).all()
    with pytest.raises(ModelError, match=r"hook blocks\.1\.mlp\.hook_expert_indices: the chosen experts must be a "
                                         r"\[15, 2\] array of distinct expert numbers 0\.\.3 per position"):
        m.forward(ids, hooks={"blocks.1.mlp.hook_expert_indices": lambda x, name: np.zeros_like(x)})
