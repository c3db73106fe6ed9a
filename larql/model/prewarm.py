"""The first run after install: compile half of a model's numba kernels in a second process.

A fresh install has no compiled kernels, and `larql run gemma3-270m ...` spent ~14 of its ~17 s
compiling them, one after another on one core (numba compiles on the calling thread, under a
process-wide lock, so threads cannot share the work). A second process can: it loads the same
model (memory-mapped, ~1 s) and runs the operations the generating process needs *last* — the
lm_head's argmax, then one weight of each quantization type from the last one met to the first,
then a decode step — so that numba's cache holds them by the time the first process, compiling from
the front, gets there (numba looks in its cache before compiling any signature, and writes an entry
atomically). The two meet in the middle; at worst both compile one kernel.

Started only when the decode kernels are missing from numba's cache (`kernels_cached`), never
waited for: if the first process finishes first, the second still fills the cache for the next run.
`LARQL_PREWARM=0` turns it off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from larql.model.model import Model
    from larql.quant.tensor import QuantMatrix

ENV_VAR = "LARQL_PREWARM"


def kernels_cached() -> bool:
    """Whether numba's cache has the decode kernels every model uses (then the rest are there too,
    having been compiled by the same first run). True when it cannot tell: no second process."""
    from larql.model import fused

    try:
        kernels: tuple[Any, ...] = (fused.decode_qk, fused.attend_one)
        return all(os.path.exists(k._cache._cache_file._index_path) for k in kernels)  # numba's own index file
    except AttributeError:  # another numba's internals
        return True


def start(model: str) -> subprocess.Popen[bytes] | None:
    """Start compiling `model`'s kernels from the back in a detached process (None: not needed)."""
    from larql.model.load import ALIASES

    if model not in ALIASES and not Path(model).expanduser().exists():
        return None  # the run itself says what is wrong with the name
    if os.environ.get(ENV_VAR, "1") == "0" or kernels_cached():
        return None
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    try:
        return subprocess.Popen([sys.executable, "-m", "larql.model.prewarm", model], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # a Ctrl-C of the run does not stop the cache filling
    except OSError:
        return None


def _matrices_from_the_back(model: Model) -> list[QuantMatrix]:
    """One matrix of each quantization type, ordered last-met first in a forward pass's order."""
    seen: dict[int, QuantMatrix] = {}
    for layer in model.weights.layers:
        for name in ("q", "k", "v", "o", "gate", "up", "down"):
            mat = getattr(layer, name)
            if mat is not None and int(mat.qtype) not in seen:
                seen[int(mat.qtype)] = mat
    return list(reversed(seen.values()))


def compile_from_the_back(model: Model) -> None:
    """Run what a generating process runs last, first: its kernels land in numba's cache."""
    out = model.weights.output
    out.argmax_matvec(np.zeros(out.n_cols, np.float32))  # the lm_head's candidate pass
    for mat in _matrices_from_the_back(model):
        mat.matmul(np.zeros((2, mat.n_cols), np.float32))  # a short prompt's kernel
        mat.matmul(np.zeros(mat.n_cols, np.float32))  # a decode step's
    cache = model.new_cache(4)
    model.next_logits(model.tokenize("a b")[-2:], cache)
    model.next_token(model.tokenize("c")[-1:], cache)  # the decode step's attention and norms


def main(argv: list[str] | None = None) -> int:
    from larql.model.load import load

    args = sys.argv[1:] if argv is None else argv
    try:
        compile_from_the_back(load(args[0]))  # a vindex directory fails here: its run compiles alone
    except Exception:  # a cache that stays cold is the only cost; the run reports its own errors
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
