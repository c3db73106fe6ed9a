"""METHOD NEURON on a tiny model: one subject-keyed neuron per subject, added to the layer (the
base features all kept), firing at the subject (act = f(a)) and exactly nowhere it was told to stay
silent (g.x = 0 at decoys and at earlier neurons' subjects), carried by patches and undone bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from larql.edit.insert import insert_facts
from larql.edit.methods.capture import capture
from larql.edit.methods.facts import Fact
from larql.edit.methods.metrics import key_metrics, stats_dir
from larql.edit.methods.neuron import PRE_ACTIVATION
from larql.edit.methods.weight_edit import HeldPrompt
from larql.edit.patches.patch import PatchOp, is_neuron
from larql.edit.state.view import edit_vindex
from larql.errors import EditError
from larql.lql.executor import execute
from larql.lql.session import Session
from larql.model.forward import norm
from larql.model.model import Model
from larql.model.targets import subject_position, target_ids
from tests.synthetic import TinySpec, tiny_vindex

PROMPT = "Colour of zeta"


@pytest.fixture(scope="module")
def vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("neuron"), TinySpec("gemma3", n_layers=4, ffn=96), seed=5, dtype="f16")


def _logp(m: Model, prompt: str, target: str) -> float:
    ids, toks = m.tokenize(prompt), target_ids(m, target)
    logits = m.forward(ids + toks[:-1]).astype(np.float64)
    logp = logits - logits.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    return float(sum(logp[len(ids) - 1 + i, t] for i, t in enumerate(toks)))


def _input_at(m: Model, layer: int, text: str, subject: str) -> np.ndarray:
    """The MLP's normalised input at the subject's last token (what the neuron's gate reads)."""
    ids, s = subject_position(m, text, subject)
    resid = capture(m, ids[: s + 1], [f"blocks.{layer}.hook_resid_mid"])[f"blocks.{layer}.hook_resid_mid"]
    return norm(m.config, resid, m.weights.layers[layer].ffn_norm)[s]


def test_neuron_insert_fires_on_its_subject_only_and_comes_off(vx: Path, tmp_path: Path) -> None:
    s = Session()
    execute(f'USE "{vx}"; BEGIN PATCH "{tmp_path / "n.vlp"}"', s)
    v = s.vindex
    m = v.model()
    base = m.forward(m.tokenize(PROMPT))
    before = _logp(m, PROMPT, "blue")
    res = execute('INSERT INTO EDGES (entity, relation, target, prompt) VALUES ("zeta", "colour", "blue", '
                  '"Colour of zeta") METHOD NEURON', s)[0]
    assert "neuron" in res.title
    op = v.patches.pending[-1]
    assert isinstance(op, PatchOp) and is_neuron(op) and op.entity == "zeta"
    layer = op.layer
    assert _logp(m, PROMPT, "blue") > before + 2.0  # the whole target is taught
    # the neuron is added past the layer's 96 features, which are all as they were
    assert op.feature == 96 and v.overlay.added(layer).keys() == {96} and not v.overlay.layer(layer)
    assert v.num_features(layer) == 97 and v.feature_meta(layer, 96).token_ids[0] == target_ids(m, "blue")[0]
    assert 96 in [f for f, _ in v.gate_knn(layer, _input_at(m, layer, PROMPT, "zeta"), 97)]
    # up = g: g.x = 1 at the subject's mean input and on the fact's own prompt as given (where it was
    # only near 1 when the mean was all it was asked for), and a decoy subject in the same prompt is
    # held to g.x = 0 exactly; gate = a (g - θ c): the gate is shut there
    g, gate = op.vectors["up"], op.vectors["gate"]
    x_subject, x_decoy = _input_at(m, layer, PROMPT, "zeta"), _input_at(m, layer, "Colour of Sweden", "Sweden")
    assert float(g @ x_subject) == pytest.approx(1.0, abs=1e-3)
    assert abs(float(g @ x_decoy)) < 1e-4
    assert key_metrics(m, [layer], stats_dir(v), point="input")[layer].bias is None  # random weights share none
    assert np.allclose(gate, PRE_ACTIVATION * g)  # without a bias direction: gate = a g

    execute("SAVE PATCH", s)
    edited = m.forward(m.tokenize(PROMPT))
    fresh = edit_vindex(vx)
    fresh.patches.apply(tmp_path / "n.vlp")
    fm = fresh.model()
    assert np.array_equal(fm.forward(fm.tokenize(PROMPT)), edited)  # the patch carries it exactly
    again = fresh.patches.applied[0].ops[0]
    assert isinstance(again, PatchOp) and is_neuron(again)  # and still says what made it
    fresh.patches.remove("n.vlp")
    assert np.array_equal(fm.forward(fm.tokenize(PROMPT)), base)


def test_with_a_bias_direction_the_gate_is_shut_below_the_threshold(vx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import larql.edit.methods.neuron as neuron

    monkeypatch.setattr(neuron, "BIAS_SPREAD", 1e9)  # the tiny model's inputs have no common part: take c anyway
    v = edit_vindex(vx)
    m = v.model()
    before = _logp(m, PROMPT, "blue")
    insert_facts(v, [Fact("zeta", PROMPT, "blue", "colour")], "neuron", measure=False)
    op = v.patches.pending[-1]
    assert isinstance(op, PatchOp)
    c = key_metrics(m, [op.layer], stats_dir(v), point="input")[op.layer].bias
    assert c is not None
    g, gate = op.vectors["up"], op.vectors["gate"]
    # gate = a (g - θ c), a set so that the gate reads PRE_ACTIVATION where g.x = 1 at the subject's inputs
    a = float(gate @ g) / float((g - neuron.THRESHOLD * c) @ g)
    assert np.allclose(gate, a * (g - neuron.THRESHOLD * c), atol=1e-5 * a)
    x_subject, x_decoy = _input_at(m, op.layer, PROMPT, "zeta"), _input_at(m, op.layer, "Colour of Sweden", "Sweden")
    assert float(gate @ x_subject) > 0.25 * PRE_ACTIVATION  # open at the subject
    # at the decoy (g.x = 0) the gate reads -a θ c.x: shut when c.x > 0
    assert float(gate @ x_decoy) == pytest.approx(-a * neuron.THRESHOLD * float(c @ x_decoy), rel=1e-3, abs=1e-3)
    assert _logp(m, PROMPT, "blue") > before + 2.0  # and the fact is taught
    # a second thresholded neuron: its gate is shut at the first subject (g.x under θ, not held at 0)
    taught = _logp(m, PROMPT, "blue")
    insert_facts(v, [Fact("omega", "Colour of omega", "red", "colour")], "neuron", measure=False)
    second = v.patches.pending[-1]
    assert isinstance(second, PatchOp) and second.feature != op.feature
    if second.layer == op.layer:
        assert float(second.vectors["up"] @ x_subject) < neuron.THRESHOLD_LEAK
        assert float(second.vectors["gate"] @ x_subject) < 0.0
    assert _logp(m, PROMPT, "blue") > taught - 0.5


def test_stacked_neurons_take_new_slots_and_stay_silent_on_each_other(vx: Path) -> None:
    v = edit_vindex(vx)
    m = v.model()
    untaught = _logp(m, PROMPT, "blue")
    insert_facts(v, [Fact("zeta", PROMPT, "blue", "colour")], "neuron", measure=False)
    taught = _logp(m, PROMPT, "blue")
    held = v._float32_weights  # the editing session keeps the float32 weights: later INSERTs dequantize nothing
    gate = m.weights.layers[1].gate
    assert held and any(np.shares_memory(a, gate.dense()) for a in held)
    insert_facts(v, [Fact("omega", "Colour of omega", "red", "colour")], "neuron", measure=False)
    assert v._float32_weights is held
    first, second = v.patches.pending
    assert isinstance(first, PatchOp) and isinstance(second, PatchOp) and first.feature != second.feature
    x_first = _input_at(m, first.layer, PROMPT, "zeta")
    assert abs(float(second.vectors["up"] @ x_first)) < 1e-4  # the new neuron is silent on the old subject
    assert _logp(m, PROMPT, "blue") > taught - 0.1 * (taught - untaught)  # so the first fact stays taught
    # a layer range spreads the subjects over it, counting the neurons already there (two at layer 1)
    insert_facts(v, [Fact("kappa", "Colour of kappa", "gold"), Fact("iota", "Colour of iota", "red")], "neuron",
                 layers=[1, 2], measure=False)
    assert [op.layer for op in v.patches.pending] == [1, 1, 2, 2]


def test_without_a_layer_neurons_fill_the_model_layers_in_order(vx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import larql.edit.methods.strategies as module

    v = edit_vindex(vx)
    m = v.model()
    monkeypatch.setattr(module, "neuron_layers", lambda name, n: (2, 1))
    monkeypatch.setattr(module, "NEURONS_PER_LAYER", 2)
    insert_facts(v, [Fact("zeta", PROMPT, "blue", "colour")], "neuron", measure=False)
    assert v.patches.pending[0].layer == 2  # the first of the model's neuron layers
    # layer 2 has room for one more, layer 1 for two; then the emptiest, the earlier in order on a tie
    assert module.neuron_layer_plan(v, m, ["a", "b", "c", "d"], None) == {2: {"a", "d"}, 1: {"b", "c"}}
    assert module.neuron_layer_plan(v, m, ["a", "b", "c"], [0, 1]) == {0: {"a", "c"}, 1: {"b"}}  # given: even



def test_a_batch_over_layers_holds_each_layer_off_the_subjects_placed_at_the_others(
        vx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each layer's neurons are planned with the texts of the batch's subjects placed at other layers
    (their prompt and the subject opening a text) and the subjects of neurons already at any layer."""
    import larql.edit.methods.strategies as module

    seen: dict[int, tuple[list[str], list[tuple[str, str]]]] = {}
    plan = module.plan_neuron_edit

    def spy(*args: Any, **kw: Any) -> Any:
        seen[args[2]] = (sorted(kw["earlier"]), [(p.text, p.word) for p in kw["elsewhere"]])
        return plan(*args, **kw)

    monkeypatch.setattr(module, "plan_neuron_edit", spy)
    v = edit_vindex(vx)
    insert_facts(v, [Fact("zeta", PROMPT, "blue", "colour")], "neuron", layers=[3], measure=False)
    insert_facts(v, [Fact("kappa", "Colour of kappa", "gold"), Fact("iota", "Colour of iota", "red")], "neuron",
                 layers=[1, 2], measure=False)
    assert seen[1] == (["zeta"], [("iota", "iota"), ("Colour of iota", "iota")])
    assert seen[2] == (["kappa", "zeta"], [("kappa", "kappa"), ("Colour of kappa", "kappa")])

def test_bias_direction_is_one_on_inputs_that_share_a_common_part() -> None:
    from larql.edit.methods.neuron import BIAS_SPREAD, bias_direction

    rng = np.random.default_rng(1)
    hidden, n = 32, 20000
    common = 4.0 * rng.standard_normal(hidden)
    x = common + 0.5 * rng.standard_normal((n, hidden))  # (n, hidden) inputs sharing `common`
    c = bias_direction(x[: n // 2].T @ x[: n // 2] / (n // 2), x[: n // 2].mean(axis=0))
    assert c is not None
    held_out = x[n // 2:] @ c
    assert abs(float(held_out.mean()) - 1.0) < 0.01 and float(held_out.std()) < BIAS_SPREAD
    centred = rng.standard_normal((n, hidden))  # no common part: no bias to be had
    assert bias_direction(centred.T @ centred / n, centred.mean(axis=0)) is None


def test_neuron_directions_fire_at_their_subject_and_nowhere_near_it() -> None:
    """More subjects than the input has dimensions: each neuron holds its own decoys, the nearest other
    subjects and wherever it would fire, and still fires exactly at its subject."""
    from larql.edit.methods.neuron import LEAK, neuron_directions
    from larql.edit.methods.rome import KeyMetric

    rng = np.random.default_rng(0)
    hidden, n = 128, 100  # 100 subjects x 2 inputs in 128 dimensions
    base = rng.standard_normal((hidden, hidden))
    metric = KeyMetric(base @ base.T / hidden + np.eye(hidden))
    common = 3.0 * rng.standard_normal((hidden, 1))  # inputs share a large component, as real ones do
    fire = [(common + rng.standard_normal((hidden, 2))).astype(np.float32) for _ in range(n)]
    held = (common + rng.standard_normal((hidden, 6))).astype(np.float32)
    owners = [-1, -1, 0, 0, 1, 5]
    gs = neuron_directions(metric, fire, held, owners)
    for j, g in enumerate(gs):
        assert np.allclose(g @ fire[j], 1.0, atol=1e-3)
        mine = [c for c, o in enumerate(owners) if o in (-1, j)]
        assert np.all(np.abs(g @ held[:, mine]) < 1e-3)
    # off its subject a neuron is quadratic in g·x: most of the other 99 subjects' inputs stay under LEAK
    off = np.abs(np.concatenate([gs[0] @ f for f in fire[1:]]))
    assert np.median(off) < LEAK and np.linalg.norm(gs[0]) < 10



def test_thresholded_directions_hold_only_where_they_would_open_and_stay_short() -> None:
    """A thresholded neuron holds the candidates where g·x would pass the leak bound (not those far
    below it, where its gate is shut), and a near-copy of its own input, which only a long g could tell
    apart, is left open rather than bought with a g that fires on ordinary text (rms over THRESHOLD_RMS)."""
    from larql.edit.methods.neuron import THRESHOLD_LEAK, THRESHOLD_RMS, neuron_directions
    from larql.edit.methods.rome import KeyMetric

    rng = np.random.default_rng(1)
    hidden = 64
    text = rng.standard_normal((hidden, 4000)) / np.sqrt(hidden)  # "ordinary" inputs: Σ = E[x xᵀ]
    metric = KeyMetric(text @ text.T / text.shape[1])
    fire = [(3.0 * rng.standard_normal((hidden, 1)) / np.sqrt(hidden)).astype(np.float32)]
    x0 = fire[0][:, 0].astype(np.float64)
    g0 = neuron_directions(metric, fire, np.zeros((hidden, 0), np.float32), [], thresholded=True)[0]
    # candidates: 10 inputs on which the unheld neuron opens (g0·x = 0.9), 20 far below its threshold
    cand = []
    for value in [0.9] * 10 + [-3.0] * 20:
        r = 3.0 * rng.standard_normal(hidden) / np.sqrt(hidden)
        cand.append(r + (value - float(g0 @ r)) * x0)
    cand_x = np.stack(cand, 1).astype(np.float32)
    g = neuron_directions(metric, fire, np.zeros((hidden, 0), np.float32), [], cand_x, 0, THRESHOLD_LEAK,
                          thresholded=True)[0]
    assert abs(float(g @ x0) - 1.0) < 1e-2
    assert np.all(np.abs(cand_x[:, :10].T @ g) < 1e-3)  # held at 0
    assert np.all(cand_x[:, 10:].T @ g < -1.0)  # not held (|g·x| > 0.6, but its gate is shut there)
    assert float(np.sqrt(g @ metric.cov @ g)) <= THRESHOLD_RMS
    # a near-copy of the subject's own input (cos 0.999) cannot be held within the bound: left, g short
    near = (x0 + 0.03 * np.linalg.norm(x0) * rng.standard_normal(hidden) / np.sqrt(hidden))[:, None]
    g_near = neuron_directions(metric, fire, np.zeros((hidden, 0), np.float32), [],
                               np.concatenate([cand_x, near.astype(np.float32)], 1), 0, THRESHOLD_LEAK,
                               thresholded=True)[0]
    assert float(g_near @ near[:, 0]) > THRESHOLD_LEAK
    assert float(np.sqrt(g_near @ metric.cov @ g_near)) <= THRESHOLD_RMS


def test_settling_moves_a_direction_least_to_fire_at_its_subject_and_close_on_the_others() -> None:
    """settle_direction: g·x = 1 at its own inputs and 0 at the others' it opened on, the change the
    smallest in Σ's norm (any other change meeting the same constraints is longer)."""
    from larql.edit.methods.neuron_settle import settle_direction
    from larql.edit.methods.rome import KeyMetric

    rng = np.random.default_rng(2)
    hidden = 48
    text = rng.standard_normal((hidden, 3000))
    metric = KeyMetric(text @ text.T / text.shape[1])
    g = rng.standard_normal(hidden).astype(np.float32) / 7
    own, leaks = rng.standard_normal((hidden, 2)).astype(np.float32), rng.standard_normal((hidden, 3)).astype(np.float32)
    g_new, held = settle_direction(metric, g, own, leaks)
    assert held == 3
    assert np.allclose(g_new @ own, 1.0, atol=1e-3) and np.allclose(g_new @ leaks, 0.0, atol=1e-3)
    d = (g_new - g).astype(np.float64)
    x = np.concatenate([own, leaks], axis=1).astype(np.float64)
    free = rng.standard_normal(hidden)
    free -= x @ np.linalg.lstsq(x, free, rcond=None)[0]  # a change that leaves every constraint as it is
    other = d + 0.1 * free
    assert float(d @ metric.cov @ d) < float(other @ metric.cov @ other)


def test_settling_a_layer_closes_a_neuron_on_the_other_subjects_it_opens_on(
        vx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A neuron made to open on another subject's text ("Colour of omega") is settled on the texts as
    the model reads them: shut there, still fully open at its own subject, and the settled insert is
    what the patch stack holds (the model runs it)."""
    from dataclasses import replace

    import larql.edit.methods.neuron as neuron
    import larql.edit.methods.neuron_settle as neuron_settle
    from larql.edit.methods.neuron_settle import SETTLE_OPEN, settle_direction, settle_layer

    monkeypatch.setattr(neuron, "BIAS_SPREAD", 1e9)  # take a bias direction on the tiny model (as above)
    # and no rms bound: the random model's directions are long anyway (rms ~0.84 on its corpus), and
    # holding omega's text lengthened this one by 0.4% — past "no longer than it was"
    monkeypatch.setattr(neuron_settle, "THRESHOLD_RMS", 1e9)
    v = edit_vindex(vx)
    m = v.model()
    insert_facts(v, [Fact("zeta", PROMPT, "blue", "colour")], "neuron", layers=[2], measure=False)
    op = v.patches.pending[-1]
    assert isinstance(op, PatchOp)
    metric = key_metrics(m, [2], stats_dir(v), point="input")[2]
    own = np.stack([_input_at(m, 2, t, "zeta") for t in ("zeta", PROMPT)], axis=1)
    other = _input_at(m, 2, "Colour of omega", "omega")[:, None]
    leaky, _ = settle_direction(metric, op.vectors["up"], np.concatenate([own, other], axis=1), other[:, :0])
    assert float(leaky @ other[:, 0]) == pytest.approx(1.0, abs=1e-2)  # opens on omega as on zeta
    v.patches.undo(1)
    v.patches.record(replace(op, vectors={**op.vectors, "up": leaky,
                                          "gate": neuron.neuron_gate(leaky, own, metric.bias, neuron.THRESHOLD)}))
    texts = {s: [HeldPrompt(t, s, s) for t in ts] for s, ts in
             {"zeta": ["zeta", PROMPT], "omega": ["omega", "Colour of omega"]}.items()}
    got = settle_layer(v, m, [v.patches.pending[-1]], texts, metric)
    assert got.moved == 1 and got.leaks >= 1
    g = got.ops[0].vectors["up"]
    assert float(g @ other[:, 0]) < SETTLE_OPEN and float(g @ _input_at(m, 2, "omega", "omega")) < SETTLE_OPEN
    assert np.allclose(g @ own, 1.0, atol=0.1)
    assert v.patches.pending[-1] is got.ops[0] and len(v.patches.pending) == 1
    assert np.allclose(v.overlay.added(2)[op.feature].up, g)


def test_subjects_that_share_their_last_words_are_keyed_on_the_words_that_tell_them_apart() -> None:
    from larql.edit.methods.defaults import subject_keys

    keys = subject_keys(["Dreitromen Pharma", "Lefel Pharma", "Vohia Tebre", "America", "Bank of America",
                         "United States of America", "Zaemin  Labs", "Kruvren Labs", "Lefel Labs"])
    assert keys == {"Dreitromen Pharma": "Dreitromen", "Vohia Tebre": "Vohia Tebre", "America": "America",
                    "Bank of America": "Bank", "United States of America": "United States", "Zaemin  Labs": "Zaemin",
                    "Kruvren Labs": "Kruvren",
                    # both would be keyed on "Lefel", which cannot tell them apart: each keeps its whole name
                    "Lefel Pharma": "Lefel Pharma", "Lefel Labs": "Lefel Labs"}
    assert subject_keys(["Dreitromen Pharma"]) == {"Dreitromen Pharma": "Dreitromen Pharma"}  # alone: all of it
    with pytest.raises(EditError, match="leading words"):
        Fact("Lefel Pharma", "Lefel Pharma was founded by", "Ada", key="Pharma")
    with pytest.raises(EditError, match="leading words"):
        Fact("Lefel Pharma", "Lefel Pharma was founded by", "Ada", key="Lef")


def test_a_neuron_fires_at_its_key_and_its_patch_names_the_whole_subject(
        vx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two subjects that end alike are keyed on their first words: the neuron's g·x is 1 at the key's
    last token (where it sits in the prompt), the patch names the subject, and a later INSERT holds
    its neurons off the earlier subjects where those are keyed. (Whether the fact is then learnt is
    measured on gemma3-270m, tests/parity/test_weight_edits.py: the tiny model's random attention
    carries little from one token to the next.)"""
    import larql.edit.methods.strategies as module

    seen: dict[str, Any] = {}
    plan = module.plan_neuron_edit

    def spy(*args: Any, **kw: Any) -> Any:
        seen.setdefault("facts", []).append({f.subject: f.keyed for f in args[1]})
        seen.setdefault("earlier", []).append(dict(kw["earlier"]))
        return plan(*args, **kw)

    monkeypatch.setattr(module, "plan_neuron_edit", spy)
    v = edit_vindex(vx)
    m = v.model()
    prompts = {"zeta corp": "Colour of zeta corp", "omega corp": "Colour of omega corp"}
    ids, s = subject_position(m, prompts["zeta corp"], "zeta corp", "zeta")
    assert m.tokenizer.decode(ids[s: s + 1]).endswith("a") and s < len(ids) - 1  # the key's last token
    insert_facts(v, [Fact("zeta corp", prompts["zeta corp"], "blue", "colour"),
                     Fact("omega corp", prompts["omega corp"], "red", "colour")], "neuron", layers=[2], measure=False)
    assert seen["facts"] == [{"zeta corp": "zeta", "omega corp": "omega"}]
    ops = {op.entity: op for op in v.patches.pending if isinstance(op, PatchOp)}
    assert set(ops) == {"zeta corp", "omega corp"}  # the patch names the subject, not its key
    g = ops["zeta corp"].vectors["up"]
    assert 0.5 < float(g @ _input_at(m, 2, prompts["zeta corp"], "zeta")) < 1.5
    insert_facts(v, [Fact("kappa corp", "Colour of kappa corp", "gold", "colour")], "neuron", layers=[2],
                 measure=False)
    assert seen["facts"][-1] == {"kappa corp": "kappa"}
    assert seen["earlier"][-1] == {"zeta corp": "zeta", "omega corp": "omega"}


def test_insert_takes_a_key_column_for_neuron_edits(vx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user names the words a neuron keys on (a lone "X Pharma" would otherwise key on " Pharma",
    which every other "... Pharma" shares); a key that is not the entity's leading words, or a key
    for another method, is refused before anything runs."""
    import larql.edit.methods.strategies as module
    from larql.errors import LqlSemanticError

    seen: list[dict[str, str]] = []
    plan = module.plan_neuron_edit

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append({f.subject: f.keyed for f in args[1]})
        return plan(*args, **kw)

    monkeypatch.setattr(module, "plan_neuron_edit", spy)
    s = Session()
    execute(f'USE "{vx}"', s)
    insert = ('INSERT INTO EDGES (entity, relation, target, key) VALUES ("zeta corp", "colour", "blue", "{}") '
              'AT LAYER 2 METHOD {}')
    execute(insert.format("zeta", "NEURON"), s)
    assert seen == [{"zeta corp": "zeta"}]
    op = s.vindex.patches.pending[-1]
    assert isinstance(op, PatchOp) and op.entity == "zeta corp"
    m = s.vindex.model()
    assert 0.5 < float(op.vectors["up"] @ _input_at(m, 2, "Colour of zeta corp", "zeta")) < 1.5
    with pytest.raises(LqlSemanticError, match="not the leading words"):
        execute(insert.format("corp", "NEURON"), s)
    with pytest.raises(LqlSemanticError, match="METHOD NEURON's"):
        execute(insert.format("zeta", "ROME"), s)
    assert len(s.vindex.patches.pending) == 1  # nothing else recorded
    # EXPLAIN keys a new subject as INSERT will: against the neuron in place ("zeta corp") too
    from larql.lql.parser import parse
    from larql.lql.planner import plan as plan_statement

    lone = 'INSERT INTO EDGES (entity, relation, target) VALUES ("omega corp", "colour", "red") AT LAYER 2 METHOD NEURON'
    assert "'omega corp' at 'omega'" in plan_statement(parse(lone)[0], s).to_text()


def test_a_layers_inputs_read_once_serve_its_plan_and_settling(vx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`held_keys` with a memo gives the columns a fresh read gives, reading only the texts it has not
    seen; and the memo may outlive the layer's own neurons: they come after its input."""
    import larql.edit.methods.weight_edit as weight_edit
    from larql.edit.methods.weight_edit import held_keys

    v = edit_vindex(vx)
    m = v.model()
    prompts = [HeldPrompt(t, w, o) for t, w, o in [("zeta", "zeta", "zeta"), (PROMPT, "zeta", "zeta"),
                                                   ("Colour of omega", "omega", "omega")]]
    fresh, owners = held_keys(m, prompts, [2], point="input")
    read: list[int] = []
    real = weight_edit.capture_batch
    monkeypatch.setattr(weight_edit, "capture_batch", lambda model, runs, names, lower=None: (
        read.append(len(runs)), real(model, runs, names, lower))[1])
    memo: dict[Any, Any] = {}
    first, _ = held_keys(m, prompts[:2], [2], point="input", memo=memo)
    got, got_owners = held_keys(m, prompts, [2], point="input", memo=memo)
    assert read == [2, 1] and got_owners == owners  # omega's text alone read the second time
    np.testing.assert_allclose(got[2], fresh[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[2][:, :3], first[2])  # BOS and zeta's two, from the memo
    insert_facts(v, [Fact("zeta", PROMPT, "blue", "colour")], "neuron", layers=[2], measure=False)
    after, _ = held_keys(m, prompts, [2], point="input")
    np.testing.assert_allclose(after[2], fresh[2], rtol=1e-5, atol=1e-6)  # the neuron at 2 comes after 2's input
    assert not np.allclose(held_keys(m, prompts, [3], point="input")[0][3],
                           held_keys(edit_vindex(vx).model(), prompts, [3], point="input")[0][3], atol=1e-4)
    v.patches.undo(len(v.patches.pending))


def test_a_large_insert_optimises_its_values_behind_fewer_prefixes(vx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import larql.edit.methods.defaults as methods
    import larql.edit.methods.strategies as insert_module

    seen: list[int] = []
    real = insert_module.plan_neuron_edit

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["n_prefixes"])
        return real(*args, **kwargs)

    monkeypatch.setattr(insert_module, "plan_neuron_edit", spy)
    facts = [Fact("zeta", PROMPT, "blue", "colour"), Fact("omega", "Colour of omega", "red", "colour")]
    for large, want in ((2, methods.N_PREFIXES), (1, methods.LARGE_BATCH_PREFIXES)):
        monkeypatch.setattr(methods, "LARGE_BATCH", large)
        v = edit_vindex(vx)
        insert_facts(v, facts, "neuron", layers=[2], measure=False)
        assert seen.pop() == want and not seen
        v.patches.undo(len(v.patches.pending))
    assert methods.LARGE_BATCH_PREFIXES < methods.N_PREFIXES


def test_texts_read_again_above_the_lowest_layer_run_from_it(vx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """capture_batch with a LowerLayers gives the activations a full pass gives (to float rounding: a
    pass packs other rows beside them); texts it has seen run from its layer (the residual there
    kept), new ones in full; a point below its layer is read in full, the store left alone. A neuron
    INSERT over two layers records the same patch with and without it."""
    from larql.edit.methods import strategies as insert_mod
    from larql.edit.methods.capture import LowerLayers, capture_batch

    m = edit_vindex(vx).model()
    runs = [m.tokenize(t) for t in (PROMPT, "Colour of omega", "zeta")]
    names = ["blocks.2.hook_resid_mid", "blocks.3.mlp.hook_post"]
    full = capture_batch(m, runs, names)
    starts: list[int] = []
    real = m.capture_batch
    monkeypatch.setattr(m, "capture_batch", lambda batch, n, start=0, resid=None: (
        starts.append(start), real(batch, n, start, resid))[1])
    lower = LowerLayers(1)
    first = capture_batch(m, runs[:2], names, lower)
    again = capture_batch(m, runs, names, lower)  # two seen, one new
    assert starts == [0, 0, 1] and set(lower.resid) == {tuple(r) for r in runs}
    for got, want in zip([*first, *again], [*full[:2], *full]):
        for name in names:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    early = ["blocks.0.hook_resid_mid"]
    below = capture_batch(m, runs, early, lower)
    assert starts[-1] == 0 and len(lower.resid) == 3
    np.testing.assert_allclose(below[0][early[0]], capture_batch(m, runs[:1], early)[0][early[0]], rtol=1e-5, atol=1e-5)
    monkeypatch.undo()

    facts = [Fact("zeta", PROMPT, "blue", "colour"), Fact("omega", "Colour of omega", "red", "colour")]
    recorded = []
    for keep in (True, False):
        if not keep:
            monkeypatch.setattr(insert_mod, "LowerLayers", lambda start: LowerLayers(10 ** 6))
        v = edit_vindex(vx)
        insert_facts(v, facts, "neuron", layers=[1, 2], measure=False)
        recorded.append(v.patches.pending)
    assert len(recorded[0]) == len(recorded[1]) == 2
    for a, b in zip(*recorded):
        assert (a.layer, a.feature) == (b.layer, b.feature)
        for k in a.vectors:
            np.testing.assert_allclose(a.vectors[k], b.vectors[k], rtol=1e-4, atol=1e-4 * np.abs(b.vectors[k]).max())


def test_texts_sharing_their_leading_tokens_run_them_once(vx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """capture_stemmed gives every row's activations as capture_batch does (to float rounding), running
    a stem several texts share once: here 3 texts behind one 6-token stem, one behind another, one alone
    and a duplicate; no stem is a whole text (the text equal to one is run alone)."""
    from larql.edit.methods.capture import capture_batch, capture_stemmed

    m = edit_vindex(vx).model()
    stem = m.tokenize("Colour of zeta and of omega")
    assert len(stem) >= 6
    runs = [stem + m.tokenize(t)[1:] for t in (" is", " was blue", " or")]
    runs += [stem[:5] + m.tokenize(" red")[1:], m.tokenize("omega"), stem[:5], runs[0]]
    names = ["blocks.1.hook_resid_mid", "blocks.2.mlp.hook_post"]
    want = capture_batch(m, runs, names)
    rows: list[int] = []
    real = m.capture_batch
    monkeypatch.setattr(m, "capture_batch", lambda batch, n, *a, **k: (rows.append(sum(map(len, batch))),
                                                                        real(batch, n, *a, **k))[1])
    got = capture_stemmed(m, runs, names)
    assert len(got) == len(runs)
    for g, w in zip(got, want):
        for name in names:
            assert g[name].shape == w[name].shape
            np.testing.assert_allclose(g[name], w[name], rtol=1e-5, atol=1e-5)
    distinct = {tuple(r) for r in runs}
    assert sum(rows) <= sum(map(len, distinct)) - 2 * len(stem)  # the long stem once, not three times
