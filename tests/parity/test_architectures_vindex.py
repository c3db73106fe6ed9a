"""The new architectures through the vindex: extraction (browse and inference), DESCRIBE, INFER and
TRACE on the tiny references of tests/golden/architectures. The inference level carries every
tensor (biases, learned positions, fused weights split, the MLP without a gate) and the config
(rope scaling, soft-caps) into the vindex, so the model run from it gives the transformers logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import larql
from larql.lql.executor import execute
from larql.vindex.extract import extract
from tests.conftest import rel_err

REFS = Path(__file__).resolve().parents[1] / "golden" / "architectures"


@pytest.mark.parametrize("arch", ["gpt2", "phi3", "phi3_longrope", "gemma2", "llama3", "qwen3"])
def test_describe_and_infer_on_an_extracted_vindex(arch: str, tmp_path: Path) -> None:
    browse = extract(REFS / arch, tmp_path / "b.vindex", level="browse", dtype="f32")
    (card,) = execute(f'USE "{browse}"; DESCRIBE "a" VERBOSE')[1:]
    assert card.title == "a" and card.notes  # a browse vindex answers DESCRIBE for any architecture
    (walk,) = execute(f'USE "{browse}"; WALK "The capital" TOP 2')[1:]
    assert len(walk.rows) == 2 * larql.load(REFS / arch).config.n_layers

    full = extract(REFS / arch, tmp_path / "i.vindex", level="inference", dtype="f32")
    ref = np.load(REFS / f"{arch}.npz")
    carried = larql.load(full)  # the model as the vindex carries it (weights.bin + index.json)
    assert rel_err(carried.dense().forward(ref["p0.ids"]), ref["p0.logits"]) <= 1e-4
    infer, trace = execute(f'USE "{full}"; INFER "Bees make honey" TOP 3; TRACE "Bees make honey"')[1:]
    direct = larql.load(REFS / arch)
    top = int(np.argmax(direct.next_logits(direct.tokenize("Bees make honey"))))
    assert len(infer.rows) == 3 and infer.rows[0][1] == direct.tokenizer.token_text(top)
    assert trace.rows


def test_weight_edits_on_gpt2_are_refused_before_any_work(tmp_path: Path) -> None:
    """ROME's hand-written backward pass has no LayerNorm: INSERT says so at once."""
    from larql.errors import LqlSemanticError

    vx = extract(REFS / "gpt2", tmp_path / "g.vindex", level="inference", dtype="f32")
    with pytest.raises(LqlSemanticError, match="weight edits \\(ROME/MEMIT\\) cannot run on gpt2: its LayerNorm has "
                                               "no backward pass in larql yet"):
        execute(f'USE "{vx}"; INSERT INTO EDGES (entity, relation, target) VALUES ("Bees", "make", "wax") METHOD ROME')
