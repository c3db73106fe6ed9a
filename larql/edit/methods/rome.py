"""Weight edits of the FFN down projection: ROME for one fact, and the same solve for a batch.

For layer L with down projection W `(hidden, ffn)`, keys K `(ffn, n)` (one per subject: the mean
down-projection input at the subject's last token, see `value.py`) and residuals R `(hidden, n)`
(the optimised change of the MLP output there), the update is the smallest change — measured by
C = E[k k^T] over ordinary text (`stats.py`), so the layer's usual inputs are disturbed least —
that makes every key produce its new output exactly:

    minimise tr(dW C dW^T)   subject to   dW K = R,   and   dW K_p = 0
    dW = R_all (K_all^T C^-1 K_all)^-1 K_all^T C^-1      with K_all = [K, K_p], R_all = [R, 0]

For n = 1 and no K_p this is ROME's rank-one update (v - Wk)(C^-1 k)^T / (k^T C^-1 k), with
r-ROME's fix (the same averaged key on both sides); for a batch it is EMMET's equality-constrained
MEMIT. K_p are the keys of the edits already made at the layer: holding them to zero change keeps
earlier edits exactly as they were (sequential batches lose nothing), which MEMIT's least-squares
form only does approximately. dW has rank n (R_all's K_p columns are zero), so it is stored as
factors U = R `(hidden, n)`, V `(ffn, n)` with dW = U V^T: 2.7k floats per fact on gemma3-270m.

Gemma's post-FFN norm: the residual stream gains post_norm(W act) rather than W act, so the value
step optimises the MLP output before that norm (ROME's per-layer target), never MEMIT's residual
split; the solve above is the same for both architectures.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from larql.edit.patches.delta import LowRankDelta
from larql.errors import EditError

F32 = NDArray[np.float32]
F64 = NDArray[np.float64]
RIDGE = 1e-2  # C + RIDGE * mean(diag C) * I: C from ~10^4 tokens underestimates its small eigenvalues
CONSTRAINT_RIDGE = 1e-6  # relative, on K^T C^-1 K: near-identical keys (one subject twice) stay solvable


class KeyMetric:
    """(C + ridge)^-1, formed once per layer (one 2048 x 2048 inverse, ~1 s): every update then
    costs a matrix product, where two triangular solves through numpy's general solver would
    cost a fresh O(d^3) factorisation each (numpy has no triangular solve; scipy is not a dependency)."""

    def __init__(self, cov: F64, ridge: float = RIDGE, bias: NDArray[np.float32] | None = None) -> None:
        if not np.all(np.isfinite(cov)):
            raise EditError("the key statistics hold NaN or infinite values; delete the statistics cache")
        d = cov.shape[0]
        reg = cov + ridge * float(np.mean(np.diag(cov))) * np.eye(d)
        try:
            np.linalg.cholesky(reg)  # positive definite, or the statistics are broken
        except np.linalg.LinAlgError as e:
            raise EditError(f"the key statistics are not positive definite ({e}); delete the statistics cache") from e
        inv = np.linalg.inv(reg)
        self.inv = (inv + inv.T) / 2.0
        self.cov = cov  # E[k kᵀ]: gᵀ C g is the mean square of g·k on ordinary text
        self.diag = np.diag(cov).copy()  # E[k_i^2]: how much each input usually carries
        self.bias = bias  # c with c·k ≈ 1 on ordinary text, where there is one (`neuron.bias_direction`)

    def solve(self, x: F64) -> F64:
        """C^-1 x for x `(ffn,)` or `(ffn, n)`."""
        return self.inv @ x


def solve_update(metric: KeyMetric, layer: int, keys: F32, residuals: F32, preserved: F32 | None = None,
                 ) -> LowRankDelta:
    """The minimum-C-norm dW with dW keys = residuals and dW preserved = 0.

    keys `(ffn, n)`, residuals `(hidden, n)`, preserved `(ffn, p)` or None."""
    k = np.asarray(keys, np.float64)
    r = np.asarray(residuals, np.float64)
    if k.ndim != 2 or r.ndim != 2 or k.shape[1] != r.shape[1]:
        raise EditError(f"keys {k.shape} and residuals {r.shape} do not pair up")
    if not (np.all(np.isfinite(k)) and np.all(np.isfinite(r))):
        raise EditError("keys or values hold NaN or infinite values")
    n = k.shape[1]
    k_all = k if preserved is None or preserved.shape[1] == 0 else np.concatenate([k, preserved], axis=1)
    cinv_k = metric.solve(k_all)  # (ffn, n + p)
    gram = k_all.T @ cinv_k  # (n + p, n + p)
    gram += CONSTRAINT_RIDGE * float(np.mean(np.diag(gram))) * np.eye(len(gram))
    # dW = R_all gram^-1 (C^-1 K_all)^T and R_all = [R, 0]: only the first n rows of gram^-1 matter
    v = cinv_k @ np.linalg.solve(gram, np.eye(len(gram))[:, :n])  # (ffn, n), gram symmetric
    return LowRankDelta(layer, r.astype(np.float32), v.astype(np.float32), k.astype(np.float32))
