"""act(g) u, act(g) and act'(g) u of the backward pass (model/activation_grad.py) against numpy's
formulas and a finite difference, including gates far outside the usual range (an inserted neuron's)."""

from __future__ import annotations

import numpy as np
import pytest

from larql.model.activation_grad import gated_and_grad
from larql.model.ffn import gelu_tanh, silu

G = np.concatenate([np.random.default_rng(0).standard_normal(5000) * 4,
                    [0.0, -0.0, 1e-6, -1e-6, 30.0, -30.0, 100.0, -100.0, 1e4, -1e4]]).astype(np.float32)
U = np.random.default_rng(1).standard_normal(len(G)).astype(np.float32)


@pytest.mark.parametrize("kind,act", [("gelu_tanh", gelu_tanh), ("silu", silu)])
def test_activation_and_its_derivative(kind: str, act: object) -> None:
    p, a, ud = gated_and_grad(kind, G.reshape(-1, 10), U.reshape(-1, 10))
    assert p.shape == a.shape == ud.shape == (len(G) // 10, 10)
    assert p.dtype == a.dtype == ud.dtype == np.float32
    assert np.isfinite(p).all() and np.isfinite(a).all() and np.isfinite(ud).all()
    ref = act(G)  # type: ignore[operator]
    np.testing.assert_allclose(a.reshape(-1), ref, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(p.reshape(-1), ref * U, rtol=1e-5, atol=2e-6)
    x = G[np.abs(G) < 20].astype(np.float64)
    h = 1e-3
    num = ((act((x + h).astype(np.float32)) - act((x - h).astype(np.float32))) / (2 * h))  # type: ignore[operator]
    u = U[np.abs(G) < 20]
    got = gated_and_grad(kind, x.astype(np.float32), u)[2]
    np.testing.assert_allclose(got, num * u, rtol=2e-2, atol=2e-3)


def test_gate_and_up_of_different_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="differ in shape"):
        gated_and_grad("silu", G[:10], U[:9])
