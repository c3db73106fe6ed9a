"""SAE features through LQL on the real Gemma 3 270M vindex: an SAE at blocks.6.hook_resid_post whose
features are known (feature i's encoder column is the direction of prompt i's last-token activation,
its decoder row the embedding of a chosen token), so EXPLAIN INFER must show feature i first on
prompt i and DESCRIBE "France" the France feature, each named by its token; every value checked
against SAELens' equations in float64 on run_with_cache's activations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from larql.lql.executor import execute
from larql.lql.session import Session
from tests.sae_files import encode64, known_directions, v6_cfg, write_sae

HOOK = "blocks.6.hook_resid_post"
# prompt -> the token its feature's decoder row writes
KNOWN = {"The capital of France is": " Paris", "I like to eat pizza with": " cheese",
         "Water boils at one hundred degrees": " Celsius", "France": " French"}


@pytest.fixture(scope="module")
def session(gemma_vindex: Path) -> Session:
    s = Session()
    execute(f'USE "{gemma_vindex}"', s)
    return s


@pytest.fixture(scope="module")
def sae(session: Session, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray], np.ndarray]:
    m = session.vindex.model()  # type: ignore[union-attr]
    runs = [m.run_with_cache(m.tokenize(p), names=[HOOK])[1][HOOK] for p in KNOWN]
    x = np.stack([r[-1] for r in runs])  # (4, hidden) last-token activations
    centre = np.concatenate([r[1:] for r in runs]).mean(axis=0)  # BOS left out: its activation is an outlier
    decoder = np.stack([m.weights.token_embd.row(m.tokenize(t)[-1]) for t in KNOWN.values()])
    t = known_directions(x, 256, seed=5, b_dec=centre, decoder=decoder)
    path = write_sae(tmp_path_factory.mktemp("sae") / "gemma-l6", t, v6_cfg(m.config.hidden, 256, hook=HOOK))
    return path, t, x


def _top_tokens(session: Session, w_dec_row: np.ndarray, n: int) -> list[str]:
    m = session.vindex.model()  # type: ignore[union-attr]
    logits = m.weights.output.dequantize().astype(np.float64) @ w_dec_row.astype(np.float64)
    return [m.tokenizer.token_text(int(i)).strip() for i in np.argsort(-logits, kind="stable")[:n]]


def test_explain_infer_shows_each_prompts_feature_with_its_token(session: Session, sae: tuple) -> None:
    path, t, x = sae
    execute(f'USE SAE "{path}" AT LAYER 6', session)
    try:
        for i, (prompt, token) in enumerate(KNOWN.items()):
            (r,) = execute(f'EXPLAIN INFER "{prompt}" LAYERS 6-6 TOP 3', session)
            rows = [row for row in r.rows if isinstance(row[1], str)]
            want = encode64(t, x[i][None, :])[0]
            order = np.argsort(-want, kind="stable")[:3]
            assert [row[1] for row in rows] == [f"SAE {f}" for f in order] and order[0] == i
            assert [row[2] for row in rows] == pytest.approx(want[order].tolist(), rel=1e-4)
            assert rows[0][3] == token.strip()  # the token feature i writes, by its decoder row
            assert [rows[0][3], *rows[0][4].split(", ")] == _top_tokens(session, t["W_dec"][i], 3)
    finally:
        execute("DROP SAES", session)


def test_describe_france_names_the_france_feature(session: Session, sae: tuple) -> None:
    path, t, x = sae
    plain = execute('DESCRIBE "France"', session)[0]
    execute(f'USE SAE "{path}"', session)
    try:
        (r,) = execute('DESCRIBE "France"', session)
    finally:
        execute("DROP SAES", session)
    rows = [row for row in r.rows if row[0] == f"SAE {HOOK}"]
    before = r.rows[:len(r.rows) - len(rows)]  # the edges as before (their scores to float rounding), SAEs after
    assert [row[:3] + row[4:] for row in before] == [row[:3] + row[4:] for row in plain.rows]
    assert [row[3] for row in before] == pytest.approx([row[3] for row in plain.rows], rel=1e-5)
    france = list(KNOWN).index("France")
    want = encode64(t, x[france][None, :])[0]  # "France" is one token: its activation is the captured one
    order = np.argsort(-want, kind="stable")[:5]
    assert [row[1] for row in rows] == [f"feature {f}" for f in order] and order[0] == france
    assert [row[3] for row in rows] == pytest.approx(want[order].tolist(), rel=1e-4)
    assert rows[0][2] == ", ".join(_top_tokens(session, t["W_dec"][france], 3)) and rows[0][2].startswith("French")
    assert all(row[4] == "L6" for row in rows)
