"""The first run after install: compile the kernels a generation needs last in a second process.

A fresh install has no compiled kernels, and a first `larql run gemma3-270m ...` spends most of its
time compiling them, one after another on one core (numba compiles on the calling thread, under a
process-wide lock, so threads cannot share the work). A second process can: it loads the same
model (memory-mapped) and runs, on zeros, what the generating process reaches last — the lm_head's
greedy argmax (its candidate pass, the slowest to compile) and the last quantization type a forward pass
meets — so that numba's cache holds them by the time the first process gets there (numba looks in
its cache before compiling a signature, and writes entries atomically). No more than that: a second
process that went on compiling from the back would meet the first in the middle, and both would
compile the same kernels (docs/design/cpu-paths.md).

Started only when numba's cache has no decode kernels (`kernels_cached`: no run has finished
before), never waited for: if the first process ends first, the second still fills the cache for
the next run. `LARQL_PREWARM=0` turns it off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from larql.model.weights import Weights
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
    """Start compiling what `model`'s generation needs last in a detached process (None: not needed)."""
    from larql.model.load import ALIASES

    path = Path(model).expanduser()
    if model not in ALIASES and (not path.is_file()):
        return None  # a bad name (the run says what is wrong), or a directory: HF and vindex runs share nothing here
    if os.environ.get(ENV_VAR, "1") == "0" or kernels_cached():
        return None
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    try:
        return subprocess.Popen([sys.executable, "-m", "larql.model.prewarm", model], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # a Ctrl-C of the run does not stop the cache filling
    except OSError:
        return None


def last_type_met(weights: Weights) -> QuantMatrix | None:
    """A matrix of the quantization type a forward pass meets last (layer by layer, q to down)."""
    seen: dict[int, QuantMatrix] = {}
    for layer in weights.layers:
        for name in ("q", "k", "v", "o", "gate", "up", "down"):
            mat = getattr(layer, name)
            if mat is not None and int(mat.qtype) not in seen:
                seen[int(mat.qtype)] = mat
    return list(seen.values())[-1] if seen else None


def compile_tiled_pass(out: Any) -> None:
    """The kernels of the lm_head's tiled candidate pass (made from a generation's 33rd step,
    `tensor.TILE_AFTER_STEPS`), compiled on a copy of its first 16 rows, not the whole 178 MB."""
    from larql.quant import argmax, argmax_tiles
    from larql.quant.types import GGMLType

    if getattr(out, "qtype", None) != GGMLType.Q8_0 or not argmax.HAVE_TILED or out.n_cols % 32:
        return
    rows = out.raw[: argmax_tiles.ROWS]
    tiled = argmax_tiles.Tiled(rows, argmax.row_norms(rows))
    tiled.candidates(np.zeros(out.n_cols, np.float32), 1.0)


def compile_the_end(weights: Weights) -> None:
    """Run on zeros what a generating process reaches last: its kernels land in numba's cache. The
    decode step's attention first (1.6 s to compile, its heads in parallel; reached after the
    prompt's pass, as the rest)."""
    from larql.model import fused

    q, kv = np.zeros((2, 32), np.float32), np.zeros((1, 4, 32), np.float32)
    fused.attend_one(q, kv, kv, 0, 1, np.float32(1.0), np.float32(0.0), np.zeros_like(q))
    out = weights.output
    out.argmax_matvec(np.zeros(out.n_cols, np.float32))  # the lm_head's candidate pass
    compile_tiled_pass(out)
    mat = last_type_met(weights)
    if mat is not None:
        mat.matmul(np.zeros((2, mat.n_cols), np.float32))  # a short prompt's kernel
        mat.matmul(np.zeros(mat.n_cols, np.float32))  # a decode step's


def main(argv: list[str] | None = None) -> int:
    from larql.model.load import gguf_weights, resolve

    args = sys.argv[1:] if argv is None else argv
    try:
        _, path = resolve(args[0])  # a GGUF file (`start` sends nothing else)
        compile_the_end(gguf_weights(path)[2])  # no tokenizer: the first process builds its own

    except Exception:  # a cache that stays cold is the only cost; the run reports its own errors
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
