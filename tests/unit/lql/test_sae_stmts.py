"""USE SAE / SHOW SAES / DROP SAE and the SAE features EXPLAIN INFER and DESCRIBE show, on the tiny
inference-level vindex, checked against SAELens' equations in float64 on the model's own activations;
and what does not fit refused with a one-line error at the statement."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from larql.errors import LqlSemanticError, LqlSyntaxError
from larql.lql import ast
from larql.lql.executor import execute, run_plan
from larql.lql.parser import parse
from larql.lql.planner import plan
from larql.lql.session import Session
from larql.lql.unparse import unparse
from tests.sae_files import (
    encode64,
    known_directions,
    random_tensors,
    transcoder_cfg,
    transcoder_tensors,
    v6_cfg,
    write_sae,
)

HOOK = "blocks.2.hook_resid_post"
PROMPTS = ["The colour of zeta is", "hello there", "one two three four"]


def test_the_statements_parse_and_unparse() -> None:
    cases = {'USE SAE "s/d" AT LAYER 6': ast.UseSaeStmt("s/d", 6), "use sae 'd'": ast.UseSaeStmt("d"),
             'USE SAE "d" LABELS "e.json" AT LAYER 2': ast.UseSaeStmt("d", 2, "e.json"),
             "SHOW SAES": ast.ShowSaesStmt(), 'DROP SAE "d"': ast.DropSaeStmt("d"), "drop saes": ast.DropSaeStmt()}
    for text, want in cases.items():
        (got,) = parse(text)
        assert got == want and parse(unparse(got)) == [got]
    for bad in ("USE SAE", "DROP SAE", 'USE SAE "d" AT LAYER 1 AT LAYER 2', "SHOW SAE", 'USE SAE "d" LABELS "x/"'):
        with pytest.raises(LqlSyntaxError):
            parse(bad)


@pytest.fixture
def s(vxi: Path) -> Session:
    session = Session()
    execute(f'USE "{vxi}"', session)
    return session


@pytest.fixture
def known(s: Session, tmp_path: Path) -> tuple[Path, dict[str, np.ndarray], np.ndarray]:
    """An SAE at layer 2 whose features 0-2 are the directions of the prompts' last-token activations."""
    m = s.vindex.model()  # type: ignore[union-attr]
    x = np.stack([m.run_with_cache(m.tokenize(p), names=[HOOK])[1][HOOK][-1] for p in PROMPTS])
    t = known_directions(x, 24, seed=3, b_dec=x.mean(axis=0) * 0.5)
    return write_sae(tmp_path / "known", t, v6_cfg(m.config.hidden, 24, hook=HOOK)), t, x


def test_use_show_and_drop(s: Session, known: tuple, tmp_path: Path) -> None:
    path = known[0]
    other = write_sae(tmp_path / "l1", random_tensors(64, 16, seed=1), v6_cfg(64, 16, hook="blocks.1.hook_resid_post"))
    (r,) = execute(f'USE SAE "{path}" AT LAYER 2', s)
    assert r.notes[0].startswith("Attached: SAE('blocks.2.hook_resid_post', standard, d_in=64, d_sae=24)")
    execute(f'USE SAE "{other}"', s)
    (shown,) = execute("SHOW SAES", s)
    assert shown.columns == ["hook", "kind", "writes", "layer", "architecture", "d_in", "d_sae", "k", "labels",
                             "path"]
    assert shown.rows == [[HOOK, "SAE", HOOK, 2, "standard", 64, 24, None, 0, str(path)],
                          ["blocks.1.hook_resid_post", "SAE", "blocks.1.hook_resid_post", 1, "standard", 64, 16,
                           None, 0, str(other)]]
    (again,) = execute(f'USE SAE "{path}"', s)  # the same hook point: replaced
    assert f'(replaces "{path}")' in again.notes[0] and len(s.saes) == 2
    (dropped,) = execute(f'DROP SAE "{path}"', s)  # by its path
    assert dropped.notes == [f'Detached: {HOOK} ("{path}")'] and list(s.saes) == ["blocks.1.hook_resid_post"]
    with pytest.raises(LqlSemanticError, match=r'no SAE ".*" is attached \(attached: ') as e:
        execute(f'DROP SAE "{path}"', s)
    assert "\n" not in e.value.message
    execute('DROP SAE "blocks.1.hook_resid_post"', s)  # by its hook point
    assert s.saes == {} and execute("SHOW SAES", s)[0].notes == ['(none: USE SAE "dir" attaches one)']
    execute(f'USE SAE "{path}"; USE SAE "{other}"', s)
    assert execute("DROP SAES", s)[0].notes == [f'Detached: {HOOK} ("{path}")',
                                                f'Detached: blocks.1.hook_resid_post ("{other}")']
    execute(f'USE SAE "{path}"', s)
    (use,) = execute(f'USE "{s.vindex.path}"', s)  # type: ignore[union-attr]  # another model: detached
    assert s.saes == {} and use.notes[0].startswith("Detached 1 SAE(s)")


def _expected(s: Session, t: dict[str, np.ndarray], acts: np.ndarray, k: int) -> list[list]:
    """(feature, activation, top token, the next two) of the k strongest features, from numpy."""
    m = s.vindex.model()  # type: ignore[union-attr]
    out = m.weights.output.dequantize().astype(np.float64)  # (vocab, hidden)
    text = m.tokenizer.token_text
    rows = []
    for f in np.argsort(-acts, kind="stable")[:k]:
        if acts[f] <= 0:
            break
        logits = out @ t["W_dec"][f].astype(np.float64)
        top = np.argsort(-logits, kind="stable")[:3]
        rows.append([int(f), float(acts[f]), text(int(top[0])).strip(), ", ".join(text(int(i)).strip() for i in top[1:])])
    return rows


def test_explain_infer_shows_the_features_the_prompt_activates(s: Session, known: tuple) -> None:
    path, t, x = known
    plain = {p: execute(f'EXPLAIN INFER "{p}" LAYERS 1-2 TOP 3', s)[0] for p in PROMPTS}
    execute(f'USE SAE "{path}"', s)
    for i, p in enumerate(PROMPTS):
        (r,) = execute(f'EXPLAIN INFER "{p}" LAYERS 1-2 TOP 3', s)
        assert r.title == plain[p].title  # the model's prediction is unchanged: the SAE is read, not spliced
        assert r.steps[-1].startswith(f"sae_features  {HOOK}: top 3 SAE features at the last position")
        sae_rows = [row for row in r.rows if isinstance(row[1], str)]
        assert r.rows[:len(r.rows) - len(sae_rows)] == plain[p].rows  # the neurons' rows as before, SAE rows last
        assert all(row[0] == 2 and row[1].startswith("SAE ") and row[5] == "" for row in sae_rows)
        got = [[int(row[1][4:]), row[2], row[3], row[4]] for row in sae_rows]
        want = _expected(s, t, encode64(t, x[i][None, :])[0], 3)
        assert got[0][0] == i and [g[0] for g in got] == [w[0] for w in want]  # prompt i fires feature i most
        assert [g[1] for g in got] == pytest.approx([w[1] for w in want], rel=1e-4)
        assert [g[2:] for g in got] == [w[2:] for w in want]
    (other_layers,) = execute(f'EXPLAIN INFER "{PROMPTS[0]}" LAYERS 0-1', s)  # the SAE's layer not read: no step
    assert not any(isinstance(row[1], str) for row in other_layers.rows)
    assert not any(st.startswith("sae_features") for st in other_layers.steps)


def test_describe_adds_the_features_most_active_on_the_entity(s: Session, known: tuple) -> None:
    path, t, _ = known
    execute(f'USE SAE "{path}"', s)
    s.source = 'DESCRIBE "zeta"'
    (stmt,) = parse(s.source)
    p = plan(stmt, s)
    assert p.steps[-1].op == "sae_features"
    # the probes' relation prompts overflow the tiny model's context: run the plan without that step
    p = replace(p, steps=tuple(st for st in p.steps if st.op != "probe_edges"))
    (r,) = run_plan(p, s)
    m = s.vindex.model()  # type: ignore[union-attr]
    ids = m.tokenize("zeta")
    x = m.run_with_cache(ids, names=[HOOK])[1][HOOK][1 if ids[0] == m.tokenizer.bos_id else 0:]
    want = _expected(s, t, encode64(t, x).max(axis=0), 5)
    rows = [row for row in r.rows if row[0] == f"SAE {HOOK}"]
    assert len(rows) == len(want) > 0
    for row, (f, act, top, more) in zip(rows, want):
        assert row[1] == f"feature {f}" and row[3] == pytest.approx(act, rel=1e-4) and row[4] == "L2"
        assert row[2] == f"{top}, {more}"
    s.source = 'DESCRIBE "zeta" AT LAYER 1'  # another layer: no SAE step
    assert all(st.op != "sae_features" for st in plan(parse(s.source)[0], s).steps)


@pytest.mark.parametrize(("cfg", "tensors", "message"), [
    (v6_cfg(32, 8, hook=HOOK), random_tensors(32, 8, 0),
     "d_in = 32, but blocks.2.hook_resid_post of this model has width 64"),
    (v6_cfg(64, 8, hook="blocks.9.hook_resid_post"), random_tensors(64, 8, 0), "layer 9 is out of range"),
    (v6_cfg(64, 8, hook="blocks.2.hook_resid_psot"), random_tensors(64, 8, 0),
     "unknown hook point 'blocks.2.hook_resid_psot'; did you mean blocks.2.hook_resid_post"),
    (v6_cfg(64, 8, hook=HOOK), {k: v for k, v in random_tensors(64, 8, 0).items() if k != "b_dec"},
     "no tensor b_dec"),
])
def test_what_does_not_fit_is_refused_in_one_line(s: Session, tmp_path: Path, cfg: dict, tensors: dict,
                                                  message: str) -> None:
    path = write_sae(tmp_path / "bad", tensors, cfg)
    with pytest.raises(LqlSemanticError) as e:
        execute(f'USE SAE "{path}"', s)
    assert message in e.value.message and "\n" not in e.value.message and s.saes == {}


def test_missing_files_a_layer_that_differs_and_no_model(s: Session, known: tuple, tmp_path: Path, vx: Path) -> None:
    with pytest.raises(LqlSemanticError, match="no SAE directory here") as e:
        execute(f'USE SAE "{tmp_path / "nothing"}"', s)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LqlSemanticError, match="no cfg.json") as e:
        execute(f'USE SAE "{tmp_path / "empty"}"', s)
    with pytest.raises(LqlSemanticError, match=r"its hook point blocks.2.hook_resid_post \(cfg.json\) is at layer 2, "
                                               r"not layer 1; drop AT LAYER 1") as e:
        execute(f'USE SAE "{known[0]}" AT LAYER 1', s)
    assert "\n" not in e.value.message and s.saes == {}
    with pytest.raises(LqlSemanticError, match="USE SAE needs model weights, and the vindex in use is browse-level"):
        execute(f'USE "{vx}"; USE SAE "{known[0]}"', Session())
    with pytest.raises(LqlSemanticError, match="no vindex in use"):
        execute(f'USE SAE "{known[0]}"', Session())


def test_a_server_refuses_use_sae(tmp_path: Path) -> None:
    from larql.serve.guard import check_request

    text = 'USE SAE "saes/l6"; EXPLAIN INFER "x"'
    with pytest.raises(LqlSemanticError, match="USE SAE is not available on a server: each request runs in a new "
                                               "session, which would not keep the SAE"):
        check_request(parse(text), text, root=tmp_path, allow_edits=True, token=None, bearer=None)
    (show, drop), writes = check_request(parse("SHOW SAES; DROP SAES"), "", root=tmp_path, allow_edits=False,
                                         token=None, bearer=None)
    assert (show, drop, writes) == (ast.ShowSaesStmt(), ast.DropSaeStmt(), False)


def test_labels_from_a_file_of_explanations(s: Session, known: tuple, tmp_path: Path) -> None:
    """Neuronpedia's export (a JSON array, or JSON Lines) or an object of feature -> label."""
    import json

    path, _, _ = known
    rows = [{"modelId": "tiny", "layer": "2-res", "index": "0", "description": " colour\nof zeta "},
            {"modelId": "tiny", "layer": "2-res", "index": "0", "description": "a second explanation"},
            {"modelId": "tiny", "layer": "2-res", "index": 1, "explanation": "greetings"}]
    (tmp_path / "e.json").write_text(json.dumps(rows))
    (tmp_path / "e.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "e_obj.json").write_text(json.dumps({"0": "colour of zeta", "1": "greetings"}))
    for name in ("e.json", "e.jsonl", "e_obj.json"):
        (r,) = execute(f'USE SAE "{path}" LABELS "{tmp_path / name}"', s)
        assert f"from {path}, 2 feature labels" in r.notes[0]
        assert dict(s.saes[HOOK].labels) == {0: "colour of zeta", 1: "greetings"}, name
    assert execute("SHOW SAES", s)[0].rows[0][8] == 2
    (r,) = execute(f'EXPLAIN INFER "{PROMPTS[1]}" LAYERS 2-2 TOP 3', s)
    first = next(row for row in r.rows if isinstance(row[1], str))
    assert first[1] == "SAE 1" and first[5] == "greetings"
    (tmp_path / "bad.json").write_text(json.dumps([{"index": "24", "description": "out of range"}]))
    with pytest.raises(LqlSemanticError, match=r"feature 24 is out of range for this SAE \(d_sae = 24\)"):
        execute(f'USE SAE "{path}" LABELS "{tmp_path / "bad.json"}"', s)
    (tmp_path / "bad2.json").write_text(json.dumps([{"index": "x", "text": "no"}]))
    with pytest.raises(LqlSemanticError, match="is not an explanation"):
        execute(f'USE SAE "{path}" LABELS "{tmp_path / "bad2.json"}"', s)


def test_infer_steer_adds_a_features_decoder_row(s: Session, known: tuple, tmp_path: Path) -> None:
    path, t, _ = known
    with pytest.raises(LqlSemanticError, match='STEER needs an attached SAE: USE SAE "dir" first'):
        execute('INFER "hello there" STEER FEATURE 0 BY 3', s)
    execute(f'USE SAE "{path}"', s)
    m = s.vindex.model()  # type: ignore[union-attr]
    ids = m.tokenize("hello there")
    plain = execute('INFER "hello there" TOP 4', s)[0]
    (r,) = execute('INFER "hello there" TOP 4 STEER FEATURE 1 BY 40', s)
    assert r.steps[1] == "steer  +40 x feature 1's decoder row at blocks.2.hook_resid_post, every position"
    assert r.notes == ["steered: +40 x feature 1 of blocks.2.hook_resid_post"]
    # the steer written out: a callback adding 40 x the decoder row at every position
    want = m.next_logits(ids, hooks={HOOK: lambda x, name: x + np.float32(40) * t["W_dec"][1]})
    top = np.argsort(-want, kind="stable")[:4]
    assert [row[1] for row in r.rows] == [m.tokenizer.token_text(int(i)) for i in top] != [row[1] for row in plain.rows]
    assert [row[3] for row in r.rows] == pytest.approx(want[top].tolist(), rel=1e-5)
    (named,) = execute(f'INFER "hello there" TOP 4 STEER "{HOOK}" FEATURE 1 BY 40', s)
    assert named.rows == r.rows
    write_sae(tmp_path / "l1", random_tensors(64, 16, seed=1), v6_cfg(64, 16, hook="blocks.1.hook_resid_post"))
    execute(f'USE SAE "{tmp_path / "l1"}"', s)
    for text, message in [('INFER "x" STEER FEATURE 1 BY 4', "STEER: several SAEs are attached"),
                          (f'INFER "x" STEER "{path}" FEATURE 24 BY 4', "feature 24 is out of range: the SAE at "
                                                                        "blocks.2.hook_resid_post has features 0-23"),
                          ('INFER "x" STEER "nope" FEATURE 1 BY 4', 'no SAE "nope" is attached'),
                          (f'INFER "x" COMPARE STEER "{path}" FEATURE 1 BY 4', "INFER ... STEER takes no COMPARE")]:
        with pytest.raises(LqlSemanticError, match=message):
            execute(text, s)


def test_features_shows_each_positions_strongest_features(s: Session, known: tuple, tmp_path: Path) -> None:
    path, t, _ = known
    with pytest.raises(LqlSemanticError, match="FEATURES reads the attached SAEs, and none is attached"):
        execute('FEATURES "hello there"', s)
    execute(f'USE SAE "{path}"', s)
    with pytest.raises(LqlSemanticError, match="FEATURES reads the attached SAEs, and none is at layer 1"):
        execute('FEATURES "hello there" AT LAYER 1', s)
    m = s.vindex.model()  # type: ignore[union-attr]
    for i, prompt in enumerate(PROMPTS):
        (r,) = execute(f'FEATURES "{prompt}" TOP 2', s)
        assert r.columns == ["position", "token", "layer", "feature", "activation", "top", "down", "label"]
        ids = m.tokenize(prompt)
        x = m.run_with_cache(ids, names=[HOOK])[1][HOOK]
        acts = encode64(t, x)
        want = []
        for p in range(len(ids)):
            want += [[p, m.tokenizer.token_text(ids[p]), 2, *row, ""] for row in _expected(s, t, acts[p], 2)]
        assert [row[:4] + row[5:] for row in r.rows] == [w[:4] + w[5:] for w in want]
        assert [row[4] for row in r.rows] == pytest.approx([w[4] for w in want], rel=1e-4, abs=1e-5)
        assert r.rows[-2][3] == i  # the last position fires its prompt's feature most
        (last,) = execute(f'FEATURES "{prompt}" AT LAYER 2 TOP 2 POSITIONS LAST', s)
        assert last.rows == r.rows[-2:] and last.steps[-1].endswith("each with the 3 tokens its decoder row writes")


def test_a_transcoder_attaches_lists_and_shows_its_features(s: Session, tmp_path: Path) -> None:
    """USE SAE on a transcoder's directory: SHOW SAES lists its kind and output hook, FEATURES and
    EXPLAIN INFER read it with the error term (the model's outputs unchanged), its features the
    float64 reference's on the MLP's normed input."""
    m = s.vindex.model()  # type: ignore[union-attr]
    h, name = m.config.hidden, "blocks.2.ln2.hook_normalized"
    t = transcoder_tensors(h, 24, seed=5, jumprelu=True, skip=True, scale=8.0)
    path = write_sae(tmp_path / "tc", t, transcoder_cfg(h, 24, 2, jumprelu=True, skip=True))
    with pytest.raises(LqlSemanticError, match=r"its hook point blocks.2.ln2.hook_normalized \(cfg.json\) is at "
                                               r"layer 2, not layer 1"):
        execute(f'USE SAE "{path}" AT LAYER 1', s)
    plain = execute(f'EXPLAIN INFER "{PROMPTS[0]}" LAYERS 2-2 TOP 3', s)[0]
    (r,) = execute(f'USE SAE "{path}" AT LAYER 2', s)
    assert r.notes[0].startswith(f"Attached: Transcoder('{name}' -> 'blocks.2.hook_mlp_out', jumprelu, skip")
    (shown,) = execute("SHOW SAES", s)
    assert shown.rows == [[name, "skip transcoder", "blocks.2.hook_mlp_out", 2, "jumprelu", h, 24, None, 0, str(path)]]
    (e,) = execute(f'EXPLAIN INFER "{PROMPTS[0]}" LAYERS 2-2 TOP 3', s)
    assert e.title == plain.title and any(isinstance(row[1], str) and row[1].startswith("SAE ") for row in e.rows)
    ids = m.tokenize(PROMPTS[0])
    mid = m.run_with_cache(ids, names=["blocks.2.hook_resid_mid"])[1]["blocks.2.hook_resid_mid"].astype(np.float64)
    x = mid / np.sqrt(np.mean(mid * mid, axis=-1, keepdims=True) + m.config.norm_eps) * \
        np.asarray(m.weights.layers[2].ffn_norm, np.float64)
    pre = x @ t["W_enc"].astype(np.float64) + t["b_enc"]
    acts = np.maximum(pre, 0.0) * (pre > t["threshold"])
    (f,) = execute(f'FEATURES "{PROMPTS[0]}" TOP 1 POSITIONS LAST', s)
    assert f.rows[0][3] == int(np.argmax(acts[-1])) and f.rows[0][4] == pytest.approx(acts[-1].max(), rel=1e-4)
    execute(f'DROP SAE "{path}"', s)
    assert s.saes == {}


def test_sae_feature_lists_where_the_feature_fires_most_in_the_corpus(
        s: Session, known: tuple[Path, dict[str, np.ndarray], np.ndarray]) -> None:
    from larql.edit.methods.stats import corpus_chunks
    from larql.lql.plan_sae import SAE_DEFAULTS

    path, t, _ = known
    for text in ("SAE FEATURE 3 TOP 4", f'sae "{path}" feature 0'):
        (stmt,) = parse(text)
        assert parse(unparse(stmt)) == [stmt]
    with pytest.raises(LqlSemanticError, match='SAE FEATURE needs an attached SAE: USE SAE "dir" first'):
        execute("SAE FEATURE 0", s)
    execute(f'USE SAE "{path}"', s)
    with pytest.raises(LqlSemanticError, match="feature 24 is out of range: the SAE at "):
        execute("SAE FEATURE 24", s)
    (r,) = execute("SAE FEATURE 1 TOP 4", s)
    m = s.vindex.model()  # type: ignore[union-attr]
    chunks = corpus_chunks(m, SAE_DEFAULTS["corpus_tokens"])
    # float64 from SAELens' equations on the model's own activations at every corpus position
    acts = [encode64(t, m.run_with_cache(c, names=[HOOK])[1][HOOK])[:, 1] for c in chunks]
    flat = sorted(((a, i, p) for i, row in enumerate(acts) for p, a in enumerate(row) if a > 0),
                  key=lambda x: (-x[0], x[1], x[2]))[:4]
    assert [row[0] for row in r.rows] == [1, 2, 3, 4]
    assert np.allclose([row[1] for row in r.rows], [a for a, _, _ in flat], rtol=1e-4, atol=1e-5)
    assert [row[2] for row in r.rows] == [m.detokenize([chunks[i][p]]) for _, i, p in flat]
    assert all(row[3].endswith(f"[{row[2]}]") for row in r.rows)
    assert any(n.startswith("writes: ") for n in r.notes) and any("statistics corpus" in n for n in r.notes)
