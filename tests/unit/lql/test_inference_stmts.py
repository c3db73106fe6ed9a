"""INFER and TRACE through LQL on a tiny inference-level vindex, checked against the model itself."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import larql
from larql.edit.patches.overlay import FeatureOverride
from larql.errors import LqlSemanticError
from larql.lql.executor import execute
from larql.lql.session import Session
from larql.model.generate import log_softmax
from larql.vindex.extract import extract
from tests.synthetic import TinySpec, hf_weights, write_gguf


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("lqlinf")
    spec = TinySpec("gemma3", n_layers=4, ffn=96)
    write_gguf(root / "m.gguf", spec, hf_weights(spec, seed=4), gguf.GGMLQuantizationType.Q8_0)
    return {"gguf": root / "m.gguf", "inference": extract(root / "m.gguf", root / "i.vindex", level="inference"),
            "browse": extract(root / "m.gguf", root / "b.vindex")}


def test_infer_matches_the_model(src: dict) -> None:
    m = larql.load(src["gguf"])
    _, res = execute(f'USE "{src["inference"]}"; INFER "hello there" TOP 3')
    logits = m.next_logits(m.tokenize("hello there"))
    top = np.argsort(-logits)[:3]
    assert [r[1] for r in res.rows] == [m.tokenizer.token_text(int(t)) for t in top]
    assert res.rows[0][2] == pytest.approx(float(np.exp(log_softmax(logits)[top[0]])), rel=1e-6)
    _, via_model = execute(f'USE MODEL "{src["gguf"]}"; INFER "hello there" TOP 3')
    assert via_model.rows == res.rows


def test_infer_compare_shows_an_overlay_edit(src: dict) -> None:
    session = Session()
    execute(f'USE "{src["inference"]}"', session)
    same = execute('INFER "hello there" TOP 3 COMPARE', session)[0]
    assert [r[1] for r in same.rows] == [r[3] for r in same.rows]
    assert "0 edited feature(s)" in same.notes[0] and "KL(dense || walk) = 0," in same.notes[0]
    m = session.vindex.model()
    ids = m.tokenize("hello there")
    _, cache = m.run_with_cache(ids, names=["blocks.3.mlp.hook_post"])
    act = cache["blocks.3.mlp.hook_post"][-1]  # (ffn,) the last position's feature activations
    f = int(np.argmax(np.abs(act)))
    before = log_softmax(m.next_logits(ids))
    target = int(np.argsort(before)[0])  # the least likely token now
    direction = m.weights.output.row(target)
    # make the strongest feature write the unlikely token's unembedding direction
    session.vindex.overlay.set(3, f, FeatureOverride(down=50 * direction / np.linalg.norm(direction) / act[f]))
    edited = execute('INFER "hello there" TOP 3 COMPARE', session)[0]
    assert "1 edited feature(s)" in edited.notes[0] and "KL(dense || walk) = 0," not in edited.notes[0]
    assert [r[3:] for r in edited.rows] == [r[3:] for r in same.rows]  # the dense side ignores the overlay
    assert log_softmax(m.next_logits(ids))[target] > before[target] + 1.0


def test_trace_rows_agree_with_infer(src: dict) -> None:
    _use, infer, default, target, decompose = execute(
        f'USE "{src["inference"]}"; INFER "hello there" TOP 1; TRACE "hello there"; '
        'TRACE "hello there" FOR "a" LAYERS 1-3; TRACE "hello there" DECOMPOSE')
    assert [r[0] for r in default.rows] == ["emb", "L0", "L1", "L2", "L3"]
    assert default.rows[-1][1] == infer.rows[0][1] and default.rows[-1][2] == pytest.approx(infer.rows[0][2], rel=1e-6)
    assert [r[0] for r in target.rows] == ["emb", "L1", "L2", "L3"] and target.rows[-1][1] >= 1
    assert all(r[6] in ("attn", "ffn") for r in target.rows[1:])
    assert all(r[4].endswith("%") for r in decompose.rows) and len(decompose.rows) == 4


def test_trace_attributions_include_the_final_norm_and_add_up_to_the_logit(src: dict) -> None:
    from larql.model import interp
    from larql.model.targets import first_target_token

    m = larql.load(src["inference"])
    ids = m.tokenize("hello there")
    for word in ("a", "there", "x"):
        _, trace = execute(f'USE "{src["inference"]}"; TRACE "hello there" FOR "{word}"')
        token = first_target_token(m, word)
        logit = float(m.next_logits(ids)[token])
        # the table: emb, then each layer's two terms; logit_so_far ends at the model's logit
        emb = trace.rows[0][5]
        layers = sum(r[3] + r[4] for r in trace.rows[1:])
        assert emb + layers == pytest.approx(trace.rows[-1][5], abs=1e-9)  # the values, unrounded
        assert trace.rows[-1][5] == pytest.approx(logit, abs=1e-4) and f"{logit:.4f}" in trace.notes[0]
        # unrounded, from the same cache: within 1e-4
        _, cache = m.run_with_cache(ids, names=["hook_embed"] + interp.residual_hook_names(range(m.config.n_layers)))
        e, parts = interp.logit_attribution(m, cache, token)
        assert e + parts.sum() == pytest.approx(logit, abs=1e-4)
        # without the final norm (the old reading) the terms do not add up: the norm matters
        raw = interp.layer_attribution(m, cache, token).sum()
        assert abs(raw - logit) > 1e-2


def test_inference_needs_weights(src: dict) -> None:
    with pytest.raises(LqlSemanticError, match="INFER needs model weights, and the vindex in use is browse-level"):
        execute(f'USE "{src["browse"]}"; INFER "x"')
    with pytest.raises(LqlSemanticError, match="TRACE ... SAVE needs POSITIONS ALL"):
        execute(f'USE "{src["inference"]}"; TRACE "x" SAVE "t.trace"')


def test_extract_then_rerun_reuses_the_vindex(src: dict, tmp_path: Path) -> None:
    script = f'EXTRACT MODEL "{src["gguf"]}" INTO "{tmp_path / "e.vindex"}" WITH INFERENCE; INFER "hi" TOP 2'
    first = execute(script)
    assert first[0].notes[0].startswith("Extraction complete")
    before = (tmp_path / "e.vindex" / "index.json").read_text()
    second = execute(script)
    assert "already holds this model at level inference: using it" in second[0].notes[0]
    assert second[1].rows == first[1].rows and (tmp_path / "e.vindex" / "index.json").read_text() == before
    with pytest.raises(LqlSemanticError, match="already holds a different vindex .* choose another path, remove it"):
        execute(f'EXTRACT MODEL "{src["gguf"]}" INTO "{tmp_path / "e.vindex"}"')  # another level: refuse


def test_explain_infer_lists_the_strongest_features(src: dict) -> None:
    m = larql.load(src["gguf"])
    _, res = execute(f'USE "{src["inference"]}"; EXPLAIN INFER "hello there" LAYERS 1-2 TOP 4 WITH ATTENTION')
    assert res.columns[-2:] == ["attends_to", "lens_top1"]
    assert [r[0] for r in res.rows] == [1] * 4 + [2] * 4
    _, cache = m.run_with_cache(m.tokenize("hello there"), names=["blocks.2.mlp.hook_post"])
    act = cache["blocks.2.mlp.hook_post"][-1]
    expected = np.argsort(-np.abs(act), kind="stable")[:4]
    assert [r[1] for r in res.rows[4:]] == list(expected)
    assert res.rows[4][2] == pytest.approx(float(act[expected[0]]), rel=1e-6)
    assert res.rows[0][6] and res.rows[1][6] == ""  # attention shown once per layer


def test_trace_save_and_load(src: dict, tmp_path: Path) -> None:
    from larql.errors import ModelFormatError
    from larql.model.trace_file import load_trace

    out = tmp_path / "t.trace"
    _, res = execute(f'USE "{src["inference"]}"; TRACE "hello there" POSITIONS ALL SAVE "{out}"')
    assert any("Saved" in n for n in res.notes)
    m = larql.load(src["gguf"])
    tr = load_trace(out)
    ids = m.tokenize("hello there")
    assert tr.prompt == "hello there" and list(tr.token_ids) == ids
    assert np.allclose(tr.residual[1:], tr.residual[:-1] + tr.attn + tr.ffn, atol=1e-4)
    logits, cache = m.run_with_cache(ids, names=[f"blocks.{m.config.n_layers - 1}.hook_resid_post"])
    assert np.array_equal(tr.residual[-1], cache[f"blocks.{m.config.n_layers - 1}.hook_resid_post"])
    assert np.allclose(tr.lens(m, m.config.n_layers), log_softmax(logits[-1]), atol=1e-4)
    assert tr.contributions(m, 7).shape == (m.config.n_layers, 2)
    (tmp_path / "bad.trace").write_bytes(out.read_bytes()[:100])
    with pytest.raises(ModelFormatError, match="truncated trace file"):
        load_trace(tmp_path / "bad.trace")
