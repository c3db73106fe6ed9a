"""The closed-form update of edit/methods/rome.py: exact on its keys, zero on held keys, minimal in C's norm."""

from __future__ import annotations

import numpy as np
import pytest

from larql.edit.methods.rome import KeyMetric, solve_update
from larql.errors import EditError


def _cov(rng: np.random.Generator, d: int, n: int = 400) -> np.ndarray:
    x = rng.standard_normal((n, d)) * np.linspace(3.0, 0.2, d)  # anisotropic, like real keys
    return x.T @ x / n


def test_rank_one_update_maps_the_key_and_equals_romes_formula() -> None:
    rng = np.random.default_rng(0)
    cov = _cov(rng, 24)
    metric = KeyMetric(cov)
    k = rng.standard_normal(24).astype(np.float32)
    r = rng.standard_normal(8).astype(np.float32)
    d = solve_update(metric, 3, k[:, None], r[:, None])
    dense = d.dense()
    assert d.rank == 1 and dense.shape == (8, 24)
    np.testing.assert_allclose(dense @ k, r, rtol=1e-4, atol=1e-5)
    cinv_k = metric.solve(k.astype(np.float64))
    rome = np.outer(r, cinv_k) / float(k @ cinv_k)  # ROME's (v - Wk)(C^-1 k)^T / (k^T C^-1 k)
    np.testing.assert_allclose(dense, rome, rtol=1e-3, atol=1e-5)


def test_batch_update_holds_preserved_keys_and_is_minimal() -> None:
    rng = np.random.default_rng(1)
    cov = _cov(rng, 32)
    metric = KeyMetric(cov)
    keys = rng.standard_normal((32, 3)).astype(np.float32)
    res = rng.standard_normal((10, 3)).astype(np.float32)
    held = rng.standard_normal((32, 5)).astype(np.float32)
    d = solve_update(metric, 0, keys, res, held)
    dense = d.dense()
    np.testing.assert_allclose(dense @ keys, res, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(dense @ held, 0.0, atol=1e-4)

    def c_norm(dw: np.ndarray) -> float:
        return float(np.trace(dw @ (cov + 1e-2 * np.mean(np.diag(cov)) * np.eye(32)) @ dw.T))

    # any other solution of the same constraints costs more in C's norm
    basis = np.linalg.svd(np.concatenate([keys, held], axis=1).T)[2][8:]  # directions no constraint sees
    other = dense + rng.standard_normal((10, len(basis))) @ basis * 0.1
    np.testing.assert_allclose(other @ keys, res, rtol=1e-3, atol=1e-4)
    assert c_norm(other) > c_norm(dense)


def test_bad_numbers_are_refused() -> None:
    metric = KeyMetric(np.eye(4))
    with pytest.raises(EditError, match="NaN"):
        solve_update(metric, 0, np.full((4, 1), np.nan, np.float32), np.ones((2, 1), np.float32))
    with pytest.raises(EditError, match="pair up"):
        solve_update(metric, 0, np.ones((4, 2), np.float32), np.ones((2, 1), np.float32))
    with pytest.raises(EditError, match="NaN"):
        KeyMetric(np.full((4, 4), np.inf))
