"""Fact editing on Gemma 3 270M through LQL: installed facts are answered, stay answered as more
are added, leave unrelated prompts nearly alone, and a saved patch reproduces the edit exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from larql.edit.methods.feature import CHECK_PROMPTS
from larql.edit.state.view import edit_vindex
from larql.lql.executor import execute
from larql.lql.session import Session
from larql.model.generate import log_softmax

FACTS = [("Atlantis", "capital", "Poseidon", "The capital of Atlantis is"),
         ("Narnia", "capital", "Cair", "The capital of Narnia is"),
         ("Mars", "language", "Martian", "The official language of Mars is")]


def _p(m, prompt: str, token_id: int) -> float:
    return float(np.exp(log_softmax(m.next_logits(m.tokenize(prompt)))[token_id]))


def test_inserted_facts_hold_and_stay_local(gemma_vindex: Path, tmp_path: Path) -> None:
    s = Session()
    patch = tmp_path / "fiction.vlp"
    execute(f'USE "{gemma_vindex}"; BEGIN PATCH "{patch}"', s)
    m = s.vindex.model()
    targets = {}
    for entity, relation, target, prompt in FACTS:
        res = execute(f'INSERT INTO EDGES (entity, relation, target) VALUES ("{entity}", "{relation}", "{target}") '
                      'METHOD FEATURE', s)[0]
        rows = {r[0]: r[1:] for r in res.rows}
        p_before, p_after = next(v for k, v in rows.items() if k.startswith("p("))
        assert p_before < 0.01 and p_after >= 0.9, (entity, p_before, p_after)
        assert rows["rank of the target"][1] == 1
        targets[prompt] = s.vindex.patches.pending[-1].meta.token_ids[0]
    for prompt, tid in targets.items():  # earlier facts survive the later inserts
        assert _p(m, prompt, tid) >= 0.85, prompt
    assert m.generate("The capital of Atlantis is", max_new_tokens=2).text.startswith(" Pose")

    dense = m.dense()
    kls, kept = [], 0
    for prompt in CHECK_PROMPTS:
        a, b = log_softmax(m.next_logits(m.tokenize(prompt))), log_softmax(dense.next_logits(dense.tokenize(prompt)))
        kls.append(float(np.sum(np.exp(b) * (b - a))))
        kept += int(np.argmax(a) == np.argmax(b))
    # most neighbours are untouched; a semantic neighbour can move ("The largest ocean on Earth is
    # the" lends some probability to " Pose" once Atlantis' capital is Poseidon: KL ~1.5, top-1 kept)
    assert kept >= 7 and float(np.median(kls)) < 0.01, (kept, kls)

    edited = m.forward(m.tokenize("The capital of Narnia is"))
    saved = execute("SAVE PATCH", s)[0].title  # 3 inserts; the 2nd re-tunes the 1st, the 3rd both
    assert saved.endswith("(6 operations: 3 inserts, 3 updates, 0 deletes)")
    fresh = edit_vindex(gemma_vindex)
    fresh.patches.apply(patch)
    assert np.array_equal(fresh.model().forward(fresh.model().tokenize("The capital of Narnia is")), edited)
    fresh.patches.remove(patch.name)
    assert np.array_equal(fresh.model().forward(m.tokenize("The capital of Narnia is")),
                          dense.forward(m.tokenize("The capital of Narnia is")))
