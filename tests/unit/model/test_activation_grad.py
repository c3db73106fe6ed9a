"""act(g) and act'(g) of the backward pass (model/activation_grad.py) against numpy's formulas and a
finite difference, including gates far outside the usual range (an inserted neuron's)."""

from __future__ import annotations

import numpy as np
import pytest

from larql.model.activation_grad import act_and_grad
from larql.model.ffn import gelu_tanh, silu

G = np.concatenate([np.random.default_rng(0).standard_normal(5000) * 4,
                    [0.0, -0.0, 1e-6, -1e-6, 30.0, -30.0, 100.0, -100.0, 1e4, -1e4]]).astype(np.float32)


@pytest.mark.parametrize("kind,act", [("gelu_tanh", gelu_tanh), ("silu", silu)])
def test_activation_and_its_derivative(kind: str, act: object) -> None:
    a, da = act_and_grad(kind, G.reshape(-1, 10))
    assert a.shape == da.shape == (len(G) // 10, 10) and a.dtype == da.dtype == np.float32
    assert np.isfinite(a).all() and np.isfinite(da).all()
    np.testing.assert_allclose(a.reshape(-1), act(G), rtol=1e-5, atol=2e-6)  # type: ignore[operator]
    x = G[np.abs(G) < 20].astype(np.float64)
    ref = act(x.astype(np.float32))  # type: ignore[operator]
    h = 1e-3
    num = ((act((x + h).astype(np.float32)) - act((x - h).astype(np.float32))) / (2 * h))  # type: ignore[operator]
    got = act_and_grad(kind, x.astype(np.float32))[1]
    np.testing.assert_allclose(got, num, rtol=2e-2, atol=2e-3)
    assert ref.shape == got.shape
