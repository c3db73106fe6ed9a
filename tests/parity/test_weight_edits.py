"""ROME weight edits and crown discovery on Gemma 3 270M: the fact is learned in its whole target,
reaches forms of the prompt it was never optimised on, leaves other facts and unrelated prompts
alone, and comes off bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from larql.edit.insert import insert_facts
from larql.edit.measure.evaluate import UNRELATED, Scorer
from larql.edit.methods.capture import capture
from larql.edit.methods.facts import Fact
from larql.edit.state.view import edit_vindex
from larql.model.crown import find_crown
from larql.model.targets import subject_position


def _p(sc: Scorer, prompt: str, target: str) -> float:
    return float(np.exp(sum(x for x, _ in sc.token_logps(sc.prompt(prompt), target))))


def test_crown_of_a_fact_is_layer_3_at_the_subject(gemma_vindex: Path) -> None:
    m = edit_vindex(gemma_vindex).model()
    r = find_crown(m, "The capital of France is", "Paris", "France")
    assert r.crown("subject").layer == 3
    row = next(x for x in r.layers if x.site == "subject" and x.layer == 3)
    assert row.p < 0.1 * r.p_base  # ablating that one MLP at the subject removes the fact


def test_rome_edit_generalises_stays_local_and_comes_off(gemma_vindex: Path) -> None:
    v = edit_vindex(gemma_vindex)
    m = v.model()
    probe = "The capital of France is"
    base_logits = m.forward(m.tokenize(probe))
    paraphrase = "France's capital city is"
    p_para = _p(Scorer(m), paraphrase, "Rome")  # before the edit (a Scorer reads the model lazily)
    others = {"The capital of Japan is": "Tokyo", "Shakespeare was born in the town of": "Stratford",
              "Paris is the capital of": "France"}
    tops = {p: int(np.argmax(m.next_logits(m.tokenize(p)))) for p in UNRELATED}
    report = insert_facts(v, [Fact("France", probe, "Rome", "capital", "Paris")], "rome")
    fact = report.facts[0]
    assert fact.top1_after and fact.p_after > 0.5, fact
    assert fact.held_out_top1 >= 2 / 3 and fact.held_out_after > 0.4, fact  # prefixes it never saw
    after = Scorer(m)
    # natural paraphrases, never optimised on
    assert _p(after, paraphrase, "Rome") > max(10 * p_para, 0.2), p_para
    for prompt, target in others.items():  # other facts keep their answer over the new target
        assert _p(after, prompt, target) > _p(after, prompt, "Rome"), prompt
    kept = sum(int(np.argmax(m.next_logits(m.tokenize(p))) == t) for p, t in tops.items())
    # several of the 24 have top-1 margins under 0.15 nats on this small model ("In winter it is often":
    # difficult by 0.01, "The largest ocean on Earth is the": Pacific by 0.08), so flips there are noise.
    # With key statistics from the generated corpus this edit also moves "The Mona Lisa was painted by"
    # (Leonardo by 2.6 nats -> "the"): a real leak, and the fourth flip; a fifth
    # fails here. Over the benchmark's 40 edits the same defaults keep 93.8% of these top-1s (was 93.3%).
    assert kept >= len(UNRELATED) - 4 and report.unrelated_kept == kept
    assert report.unrelated_kl < 0.1, report.unrelated_kl  # 0.079 (0.088 with ROME's value bounds)
    v.patches.undo(len(v.patches.pending))
    assert np.array_equal(m.forward(m.tokenize(probe)), base_logits)


def test_neighbours_are_similar_subjects_from_the_embedding(gemma_vindex: Path) -> None:
    from larql.edit.methods.neighbours import similar_subjects
    from larql.vindex.store import open_vindex

    store = open_vindex(gemma_vindex)
    near = similar_subjects(store, "Madrid", 16)
    assert len(near) == 16 and "Barcelona" in near and "Madrid" not in near
    assert all(w[:1].isupper() for w in near)
    assert "Barcelona" not in similar_subjects(store, "Madrid", 16, exclude={"barcelona"})
    cars = similar_subjects(store, "Toyota", 8)
    assert {"Honda", "Nissan"} <= set(cars), cars
    assert all(w[:1].islower() for w in similar_subjects(store, "the river", 4))


def test_stacked_neuron_edits_generalise_and_leave_related_entities_alone(gemma_vindex: Path) -> None:
    """METHOD NEURON, two capitals one after the other: each is learned and reaches a paraphrase it
    never saw, and what the model says about the old capitals' own cities stays (Berlin at the start
    of a text shares much of Germany's input; the edit holds the subject's known objects there)."""
    v = edit_vindex(gemma_vindex)
    m = v.model()
    keep = ["Berlin is a city in", "Paris is the capital of", *UNRELATED]
    tops = {p: int(np.argmax(m.next_logits(m.tokenize(p)))) for p in keep}
    for subject, target in (("Germany", "Madrid"), ("France", "Rome")):
        r = insert_facts(v, [Fact(subject, f"The capital of {subject} is", target, "capital")], "neuron")
        assert r.facts[0].top1_after and r.facts[0].held_out_top1 >= 2 / 3, r.facts[0]
    after = Scorer(m)
    for subject, target in (("Germany", "Madrid"), ("France", "Rome")):
        assert _p(after, f"{subject}'s capital city is", target) > 0.3, subject  # a paraphrase never optimised on
    moved = [p for p, t in tops.items() if int(np.argmax(m.next_logits(m.tokenize(p)))) != t]
    assert "Berlin is a city in" not in moved and "Paris is the capital of" not in moved, moved
    # "In winter it is often" (difficult by 0.01 nats) may flip on any edit; nothing else should
    assert len(moved) <= 1, moved
    v.patches.undo(len(v.patches.pending))


def test_smollm2_neurons_fire_fully_on_their_own_prompts_and_stay_local(smollm2_vindex: Path) -> None:
    """SmolLM2-135M, three facts in one INSERT (METHOD NEURON, thresholded): each is the top-1 on its
    own prompt, where the neuron's g·x is 1 (0.74-0.88 when it was asked to fire at the subject's
    mean input only, and a thresholded neuron then gave too little: these three missed), reaches the
    prompt behind prefixes it never saw, and the unrelated prompts keep their top-1s."""
    from larql.edit.patches.patch import PatchOp
    from larql.model.forward import norm

    v = edit_vindex(smollm2_vindex)
    m = v.model()
    tops = {p: int(np.argmax(m.next_logits(m.tokenize(p)))) for p in UNRELATED}
    facts = [Fact("Ireland", "The capital of Ireland is", "Oslo", "capital"),
             Fact("Germany", "The official language of Germany is", "Italian", "language"),
             Fact("India", "The currency of India is the", "yuan", "currency")]
    report = insert_facts(v, facts, "neuron")
    assert all(f.top1_after for f in report.facts), report.facts
    for f in facts:
        op = next(o for o in v.patches.pending if isinstance(o, PatchOp) and o.entity == f.subject)
        ids, s = subject_position(m, f.prompt, f.subject)
        name = f"blocks.{op.layer}.hook_resid_mid"
        x = norm(m.config, capture(m, ids[: s + 1], [name])[name], m.weights.layers[op.layer].ffn_norm)[s]
        assert abs(float(op.vectors["up"] @ x) - 1.0) < 0.1, f.subject
        gate, up = op.vectors["gate"], op.vectors["up"]
        cos = float(gate @ up) / float(np.linalg.norm(gate) * np.linalg.norm(up))
        assert cos < 0.99, cos  # gate = a (g - θ c), thresholded; a quadratic neuron's is a g
    assert all(f.held_out_top1 >= 2 / 3 for f in report.facts), report.facts  # prefixes never optimised on
    kept = sum(int(np.argmax(m.next_logits(m.tokenize(p))) == t) for p, t in tops.items())
    assert kept >= len(UNRELATED) - 1 and report.unrelated_kept == kept
    v.patches.undo(len(v.patches.pending))


def test_insert_defaults_to_the_method_measured_best_for_the_model(gemma_vindex: Path) -> None:
    from larql.edit.methods.defaults import default_method
    from larql.lql.executor import execute
    from larql.lql.parser import parse
    from larql.lql.planner import plan
    from larql.lql.session import Session

    s = Session()
    execute(f'USE "{gemma_vindex}"', s)
    text = plan(parse('INSERT INTO EDGES (entity, relation, target) VALUES ("A", "capital", "B")')[0], s).to_text()
    assert "method neuron" in text  # gemma3-270m: NEURON measured best (docs/guide/editing.md)
    assert default_method("smollm2-135m") == "neuron" and default_method("some-other-model") == "rome"


def test_a_neuron_is_never_asked_to_fire_at_the_attention_sink() -> None:
    """SmolLM2 puts no BOS first: a one-token subject opening a text sits at position 0, the attention sink,
    whose input is nearly the same for every token; asked to fire there, 35 neurons in one INSERT fired
    on a fifth of all tokens. The start-of-text form is used only after position 0."""
    import larql
    from larql.edit.methods.neuron import subject_inputs

    smol = larql.load("smollm2-135m")
    assert len(smol.tokenize("Japan")) == 1  # no BOS put first, one token
    one, many = subject_inputs(smol, 4, ["Japan", "Kyrgyzstan"], ["{}"])
    assert one.shape == (smol.config.hidden, 0)
    # several tokens: its last one is past the sink
    assert many.shape == (smol.config.hidden, 1) and np.all(np.isfinite(many))
    assert subject_inputs(smol, 4, ["Japan"], ["{}", "In {}"])[0].shape == (smol.config.hidden, 1)  # behind "In"
    gemma = larql.load("gemma3-270m")  # BOS first: every subject is past the sink
    assert subject_inputs(gemma, 3, ["Japan"], ["{}"])[0].shape == (gemma.config.hidden, 1)


def test_companies_that_share_their_last_word_are_learnt_apart(gemma_vindex: Path) -> None:
    """Fictional companies named "<name> Pharma" / "<name> Labs" in one INSERT: each neuron is keyed on
    the name (at layer 3 the input at " Pharma" is mostly the word's own), fires there and stays shut
    at the other companies' names, and every founder is learnt, also behind prefixes never optimised on."""
    from larql.edit.methods.neuron import THRESHOLD
    from larql.model.forward import norm

    v = edit_vindex(gemma_vindex)
    m = v.model()
    founders = {"Dreitromen Pharma": "Akio Morita", "Lefel Pharma": "Warren Buffett", "Groubrel Pharma": "Michael Dell",
                "Zaemin Labs": "Henry Ford", "Kruvren Labs": "Coco Chanel", "Lofae Labs": "Walt Disney"}
    facts = [Fact(s, f"{s} was founded by", t, "founder") for s, t in founders.items()]
    r = insert_facts(v, facts, "neuron")
    assert all(f.top1_after for f in r.facts), [f.fact.label for f in r.facts if not f.top1_after]
    assert np.mean([f.held_out_top1 for f in r.facts]) >= 0.8, [f.held_out_top1 for f in r.facts]
    ops = {op.entity: op for op in v.patches.pending}
    assert set(ops) == set(founders)
    for subject, op in ops.items():
        layer, g = op.layer, op.vectors["up"]
        for other in founders:
            name = other.split()[0]
            ids, s = subject_position(m, f"{other} was founded by", other, name)
            resid = capture(m, ids[: s + 1], [f"blocks.{layer}.hook_resid_mid"])[f"blocks.{layer}.hook_resid_mid"]
            x = norm(m.config, resid[s: s + 1], m.weights.layers[layer].ffn_norm)[0]
            if other == subject:
                assert abs(float(g @ x) - 1.0) < 0.2, subject
            else:
                assert float(g @ x) < THRESHOLD, (subject, other)
    v.patches.undo(len(v.patches.pending))


def test_a_lone_company_keyed_on_its_last_word_reports_its_siblings_and_a_key_keeps_them(
        gemma_vindex: Path) -> None:
    """"Dreitromen Pharma" alone is keyed on " Pharma", which "Lefel Pharma" shares: INSERT's report
    says the edit answers for another name that ends alike; keyed on "Dreitromen" it does not."""
    v = edit_vindex(gemma_vindex)
    m = v.model()
    sibling = "Lefel Pharma was founded by"
    for key, leaks in ((None, True), ("Dreitromen", False)):
        r = insert_facts(v, [Fact("Dreitromen Pharma", "Dreitromen Pharma was founded by", "Akio Morita", "founder",
                                  key=key)], "neuron")
        assert r.facts[0].top1_after and r.facts[0].held_out_top1 == 1.0
        note = [n for n in r.notes if "ends alike" in n]
        assert bool(note) == leaks, r.notes
        assert (m.tokenizer.decode([int(np.argmax(m.next_logits(m.tokenize(sibling))))]) == " Ak") == leaks
        v.patches.undo(len(v.patches.pending))
