"""An INSERT seen through SAEs: the features that rose and fell on the edited prompt equal those read
from the model before and after the edit, an SAE read before the edit's layer reports no change,
and LQL's INSERT lists both in its notes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from larql.edit.insert import insert_facts
from larql.edit.measure.evaluate import UNRELATED
from larql.edit.measure.features import TOP_K, feature_shift
from larql.edit.methods.facts import Fact
from larql.edit.state.view import edit_vindex
from larql.lql.executor import execute
from larql.lql.session import Session
from larql.model.interp import sae_activations
from larql.model.sae_load import load_sae
from tests.sae_files import random_tensors, v6_cfg, write_sae
from tests.synthetic import TinySpec, tiny_vindex

PROMPT = "Colour of zeta"
EDIT_LAYER = 2


@pytest.fixture(scope="module")
def vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("shift"), TinySpec("gemma3", n_layers=4, ffn=96), seed=5, dtype="f16")


@pytest.fixture(scope="module")
def sae_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("saes")
    return {layer: write_sae(root / f"l{layer}", random_tensors(64, 256, seed=layer),
                             v6_cfg(64, 256, hook=f"blocks.{layer}.hook_resid_post")) for layer in (0, 3)}


def test_the_shift_is_read_from_the_activations_as_documented() -> None:
    before = np.array([[1.0, 0.0, 2.0, 0.5], [3.0, 1.0, 0.0, 0.5]], np.float32)
    after = np.array([[0.0, 4.0, 2.0, 0.5], [3.0, 1.0, 0.0, 0.5]], np.float32)
    unrel_b = np.array([[5.0, 4.0, 0.0, 1.0]], np.float32)
    unrel_a = np.array([[5.0, 0.0, 3.0, 1.0]], np.float32)
    s = feature_shift("h", before, after, unrel_b, unrel_a, k=2, shown=3)
    assert [(c.feature, c.before, c.after) for c in s.rose] == [(1, 0.5, 2.5)]  # mean over the prompts
    assert [(c.feature, c.before, c.after) for c in s.fell] == [(0, 2.0, 1.5)]
    assert s.edited_change == pytest.approx(5.0 / 8.0)
    assert s.unrelated_kept == pytest.approx(0.5)  # top-2 {0, 1} -> {0, 2}
    assert s.unrelated_change == pytest.approx(7.0 / 10.0)


def test_insert_reports_the_features_the_edit_moved(vx: Path, sae_dirs: dict[int, Path]) -> None:
    saes = [load_sae(sae_dirs[0]), load_sae(sae_dirs[3])]
    base = edit_vindex(vx).model()
    ids = base.tokenize(PROMPT)
    acts_before = sae_activations(base, ids, saes)[1]
    v = edit_vindex(vx)
    r = insert_facts(v, [Fact("zeta", PROMPT, "blue", "colour")], "neuron", layers=[EDIT_LAYER], saes=saes)
    acts_after = sae_activations(v.model(), ids, saes)[1]
    early, late = r.features
    assert early.hook == "blocks.0.hook_resid_post" and early.edited_change == 0 and early.unrelated_change == 0
    assert not early.rose and not early.fell and early.unrelated_kept == 1.0
    delta = acts_after[late.hook][-1] - acts_before[late.hook][-1]
    assert np.abs(delta).max() > 0  # the edit at layer 2 reaches layer 3's features
    top_rise = int(np.lexsort((np.arange(len(delta)), -delta))[0])
    assert late.rose[0].feature == top_rise
    assert late.rose[0].before == pytest.approx(float(acts_before[late.hook][-1, top_rise]), abs=1e-5)
    assert late.rose[0].after == pytest.approx(float(acts_after[late.hook][-1, top_rise]), abs=1e-5)
    assert len(late.rose[0].tokens) == 3  # a residual-width SAE: its decoder row's top tokens
    assert 0.0 <= late.unrelated_kept <= 1.0 and len(UNRELATED) > TOP_K


def test_lql_insert_lists_each_attached_sae(vx: Path, sae_dirs: dict[int, Path], tmp_path: Path) -> None:
    s = Session()
    execute(f'USE "{vx}"; BEGIN PATCH "{tmp_path / "f.vlp"}"; USE SAE "{sae_dirs[0]}"; USE SAE "{sae_dirs[3]}"', s)
    res = execute('INSERT INTO EDGES (entity, relation, target, prompt) VALUES ("zeta", "colour", "blue", '
                  f'"{PROMPT}") METHOD NEURON AT LAYER {EDIT_LAYER}', s)[0]
    notes = "\n".join(res.notes)
    assert "SAE features at blocks.0.hook_resid_post: unchanged" in notes
    assert "SAE features at blocks.3.hook_resid_post on the edited prompts: rose " in notes
    assert f"of their top-{TOP_K} features" in notes
