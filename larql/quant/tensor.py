"""QuantMatrix: a weight matrix kept as its raw GGUF blocks, with checked dequantize / matmul."""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import numba
import numpy as np
from numpy.typing import NDArray

from larql.errors import QuantError
from larql.quant import argmax, argmax_tiles, dequant_rows, dot_kernels, kernels, kquant_rows, reference, repack
from larql.quant.types import BLOCK_LAYOUT, GGMLType, row_bytes

# what every kernel takes first: (qtype, block_size, type_size, raw rows, the same bytes as int8, f16/bf16 table)
KernelArgs = tuple[int, int, int, NDArray[np.uint8], NDArray[np.int8], NDArray[np.float32]]

# Above this many activation rows a weight is dequantized in chunks and multiplied with BLAS; at
# or below it, the `matmul_small_*` kernels stream the blocks once (cheaper than writing float32 weights).
SMALL_BATCH = 16
# Rows dequantized at once on the BLAS path (bounds the scratch to CHUNK_ROWS * n_cols floats).
CHUNK_ROWS = 4096
# Gathers of at most this many rows (a prompt's embeddings) use the numpy reference, bit-identical to the
# kernels: a run that never takes the BLAS path compiles no dequantization kernel (0.8 s of a first run).
GATHER_NUMPY = 256
# Greedy steps on a Q8_0 lm_head before its tiled copy is made (`QuantMatrix.tiled`): the copy wins back
# its making after ~100 steps; a short `larql run` (8 tokens: 3.07 s without, 3.74 s with) runs the row pass
TILE_AFTER_STEPS = 32
# Rows of one top_k call from which a Q8_0 matrix's tiled copy is made for it (topk_tiles.py): the
# copy costs ~0.35 s on Gemma's lm_head and saves ~1.2 ms a row; once made, every call uses it
TILED_TOP_K_ROWS = 128


_scratch = threading.local()

# Memory that int8 copies (repack.py's, argmax_tiles.py's) may take in all: the matrices used first
# get it. LARQL_REPACK_MB=0 turns them off (the kernels then read the GGUF blocks).
_repack_budget = [int(os.environ.get("LARQL_REPACK_MB", "1024")) << 20]
# Types decode reads straight from their blocks (kquant_rows.py) are not repacked: a Q4_K_M model
# holds no second copy beside the mapped file. LARQL_REPACK_ALL=1 repacks them too, to compare.
REPACK_DIRECT = os.environ.get("LARQL_REPACK_ALL", "0") not in ("", "0")
_repack_lock = threading.RLock()  # reentrant: the tiled copy's maker asks for the row norms under it
_T = TypeVar("_T")


def mapped_empty(shape: tuple[int, int]) -> NDArray[np.float32]:
    """An uninitialised float32 array in a private memory mapping of its own, unmapped (given back to
    the system) the moment the array is freed. For large copies that outlive a call: glibc serves
    blocks under its mmap threshold (up to 32 MB) from the heap and keeps them when freed, so an
    ended editing session's float32 weights (~400 MB on gemma3-270m) stayed in the process."""
    if not hasattr(mmap, "MAP_PRIVATE"):  # Windows maps no private anonymous memory by flags
        return np.empty(shape, np.float32)
    n = shape[0] * shape[1]
    buf = mmap.mmap(-1, max(4 * n, 1), flags=mmap.MAP_PRIVATE)  # anonymous: fileno -1
    return np.frombuffer(buf, np.float32, n).reshape(shape)


def _made_once(slot: list[_T], make: Callable[[], _T]) -> _T:
    """slot's one value, made by `make` on first use (under the lock: two threads make it once)."""
    if slot:
        return slot[0]
    with _repack_lock:
        if not slot:
            slot.append(make())
        return slot[0]


def _take_budget(size: int) -> bool:
    """Take `size` bytes of the repacking budget if that much is left."""
    if size > _repack_budget[0]:
        return False
    _repack_budget[0] -= size
    return True


def _release_budget(size: int) -> None:
    with _repack_lock:  # a freed copy's bytes
        _repack_budget[0] += size


@contextmanager
def _one_numba_thread() -> Iterator[None]:
    """Dequantize on this thread only around BLAS calls: numba's OpenMP workers spin after a
    parallel region and would steal the cores BLAS is about to use (prefill more than twice as fast;
    docs/design/cpu-paths.md)."""
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(threads)


def _scratch_rows(n_rows: int, n_cols: int) -> NDArray[np.float32]:
    """A reused per-thread float32 buffer: fresh multi-megabyte arrays cost page faults every call."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < n_rows * n_cols:
        buf = _scratch.buf = np.empty(n_rows * n_cols, dtype=np.float32)
    return buf[: n_rows * n_cols].reshape(n_rows, n_cols)


@dataclass(frozen=True)
class QuantMatrix:
    """`n_rows x n_cols` weights (row-major, as GGUF stores them: one row per output feature).

    `raw` is uint8 `[n_rows, row_bytes]`, usually a zero-copy view into a memory map.
    """

    name: str
    qtype: GGMLType
    n_rows: int
    n_cols: int
    raw: NDArray[np.uint8]
    _repacked: list[repack.Repacked | None] = field(default_factory=list, compare=False, repr=False)
    _row_norms: list[NDArray[np.float64] | None] = field(default_factory=list, compare=False, repr=False)
    _tiled: list[argmax_tiles.Tiled | None] = field(default_factory=list, compare=False, repr=False)
    _greedy_steps: list[int] = field(default_factory=lambda: [0], compare=False, repr=False)
    _dense: list[weakref.ref[NDArray[np.float32]]] = field(default_factory=list, compare=False, repr=False)
    _vector: list[Callable[[NDArray[np.float32], NDArray[np.float32]], None] | None] = field(
        default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        expected = (self.n_rows, row_bytes(self.qtype, self.n_cols))
        if self.raw.dtype != np.uint8 or self.raw.shape != expected:
            raise QuantError(
                f"{self.name}: {self.qtype.name} data is {self.raw.dtype}{list(self.raw.shape)}, "
                f"expected uint8{list(expected)} for {self.n_rows}x{self.n_cols} weights"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_rows, self.n_cols)

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    def _args(self, raw: NDArray[np.uint8]) -> KernelArgs:
        block_size, type_size = BLOCK_LAYOUT[self.qtype]
        table = kernels.BF16_TO_F32 if self.qtype == GGMLType.BF16 else kernels.F16_TO_F32
        return int(self.qtype), block_size, type_size, raw, raw.view(np.int8), table

    def dequantize(self, rows: slice = slice(None), out: NDArray[np.float32] | None = None) -> NDArray[np.float32]:
        """Float32 `[rows, n_cols]`, bit-identical to gguf-py's dequantization (into `out` if given)."""
        raw = self.raw[rows]
        if self.qtype == GGMLType.F32:
            return np.array(raw.view(np.float32))
        if out is None:
            out = np.empty((raw.shape[0], self.n_cols), dtype=np.float32)
        args = self._args(raw)
        kernel = dequant_rows.DEQUANTIZE.get(args[0])
        if kernel is not None:
            kernel(*args[3:], out)
        else:
            kernels.dequantize_rows(*args, out)
        return out

    def dense(self) -> NDArray[np.float32]:
        """`dequantize()` kept read-only for as long as a caller holds it: for callers that hold the
        float32 weights anyway (an edit's backward pass holds every layer above the edit, per model).
        While it lives, every such caller gets the same array and batched products read it instead
        of dequantizing a chunk per call (the same values: dequantization is exact). The matrix keeps
        only a weak reference, so a served model's weights do not grow by a float32 copy for good
        once one session has edited. F32 weights are their own dense form (a read-only view)."""
        if self.qtype == GGMLType.F32:
            view = self.raw.view(np.float32)
            view.flags.writeable = False
            return view
        with _repack_lock:
            kept = self._dense[0]() if self._dense else None
            if kept is None:
                kept = self.dequantize(out=mapped_empty((self.n_rows, self.n_cols)))
                kept.flags.writeable = False
                self._dense[:] = [weakref.ref(kept)]
            return kept

    def row(self, index: int) -> NDArray[np.float32]:
        """One dequantized row, e.g. a token's embedding."""
        if not 0 <= index < self.n_rows:
            raise QuantError(f"{self.name}: row {index} out of range 0..{self.n_rows - 1}")
        return self.rows(np.array([index]))[0]

    def rows(self, indices: NDArray[np.int64]) -> NDArray[np.float32]:
        """Dequantized rows gathered by index (embedding lookup)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n_rows):
            raise QuantError(f"{self.name}: row index out of range 0..{self.n_rows - 1}")
        raw = np.ascontiguousarray(self.raw[idx])
        if len(idx) <= GATHER_NUMPY and self.qtype in reference.DEQUANTIZE:
            return reference.dequantize_reference(raw, self.qtype, self.n_cols)
        return QuantMatrix(self.name, self.qtype, len(idx), self.n_cols, raw).dequantize()

    def repacked(self) -> repack.Repacked | None:
        """The int8 + scale copy the small-batch path runs on, made on first use while the
        process-wide budget lasts (None: not a repackable type, a type decode reads directly unless
        LARQL_REPACK_ALL is set, or no budget left)."""
        def make() -> repack.Repacked | None:
            if (self.qtype not in repack.REPACKABLE or self.n_cols % 32
                    or (int(self.qtype) in kquant_rows.MATVEC and not REPACK_DIRECT)):
                return None
            size = int(self.n_rows * self.n_cols * repack.nbytes_per_weight(self.qtype))
            if not _take_budget(size):
                return None
            block_size, type_size = BLOCK_LAYOUT[self.qtype]
            result = repack.repack(self.qtype, block_size, type_size, self.raw, kernels.F16_TO_F32, self.n_cols)
            weakref.finalize(result, _release_budget, size)  # a freed model gives it back
            return result

        return _made_once(self._repacked, make)

    def vector_kernel(self) -> Callable[[NDArray[np.float32], NDArray[np.float32]], None] | None:
        """The kernel `matmul` runs for one activation, bound to these weights: kernel(x `[n_cols]`,
        out `[n_rows]`, both float32 C-contiguous) — the repacked copy's, else the type's direct one
        (kquant_rows.py), else dot_kernels'; None for F32, F16, BF16 (numpy, the generic kernel). For
        a caller that runs one matrix many times (decode_layer.py) without matmul's checks. Bound once."""
        def make() -> Callable[[NDArray[np.float32], NDArray[np.float32]], None] | None:
            fast = self.repacked()
            if fast is not None:
                return repack.matvec_kernel(fast)
            direct = kquant_rows.MATVEC.get(int(self.qtype))
            if direct is not None:
                return partial(direct, self.raw)
            kernel = dot_kernels.MATVEC.get(int(self.qtype))
            return None if kernel is None else partial(kernel, *self._args(self.raw)[3:])

        return _made_once(self._vector, make)

    def row_norms(self) -> NDArray[np.float64] | None:
        """|w_r| of every Q8_0 row (argmax.row_norms), made once (None: not finite)."""
        def make() -> NDArray[np.float64] | None:
            norms = argmax.row_norms(self.raw)
            return norms if np.isfinite(norms).all() else None

        return _made_once(self._row_norms, make)

    def argmax_matvec(self, x: NDArray[np.float32]) -> int:
        """`int(np.argmax(self.matmul(x)))` for one activation x `[n_cols]`, the same index always; for
        Q8_0 by a candidate pass of int8 dot products and exact rescoring (argmax.py), else in full."""
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        if self.qtype != GGMLType.Q8_0 or not argmax.HAVE_TILED or x.shape[0] != self.n_cols:
            return int(np.argmax(self.matmul(x)))
        self._greedy_steps[0] += 1
        # the tiled copy costs ~0.35 s to make (Gemma's lm_head, mostly page faults) and saves ~3.5 ms a
        # step: made once a generation is long enough to win it back, not for a short one
        tiles = self.tiled() if self._greedy_steps[0] > TILE_AFTER_STEPS else (self._tiled[0] if self._tiled else None)
        return argmax.argmax_q8_0(self.raw, self.row_norms(), x, tiles)

    def tiled(self) -> argmax_tiles.Tiled | None:
        """The tiled int8 copy greedy decoding's candidate pass runs on (argmax_tiles.py), made on
        first call — `argmax_matvec` calls it from its TILE_AFTER_STEPS-th step on — while the
        repacking budget lasts (None: not Q8_0 with finite row norms, or no budget)."""
        def make() -> argmax_tiles.Tiled | None:
            if self.qtype != GGMLType.Q8_0 or self.n_cols % 32:
                return None
            norms = self.row_norms()
            size = self.raw.nbytes + self.n_rows * 16  # the copy, padded to whole tiles: ~the Q8_0 bytes
            if norms is None or not _take_budget(size):
                return None
            result = argmax_tiles.Tiled(self.raw, norms)
            weakref.finalize(result, _release_budget, size)
            return result

        return _made_once(self._tiled, make)

    def matmul(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        """x `[k]` or `[t, k]` (k = n_cols) -> x @ W.T, `[n_rows]` or `[t, n_rows]` float32."""
        vector = self._vector[0] if self._vector else None  # bound by a first one-row call (below)
        if vector is not None and isinstance(x, np.ndarray) and 1 <= x.ndim <= 2 and x.size == x.shape[-1] == self.n_cols:
            # one activation (a decode step's, on the general path: hooks, edits): straight to the
            # kernel, where the checks and reshapes below cost a few us each
            out = np.empty((1, self.n_rows) if x.ndim == 2 else self.n_rows, dtype=np.float32)
            vector(np.ascontiguousarray(x, dtype=np.float32).reshape(-1), out.reshape(-1))
            return out
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.shape[-1] != self.n_cols or x.ndim not in (1, 2):
            raise QuantError(
                f"{self.name}: cannot multiply {self.n_rows}x{self.n_cols} weights by an input "
                f"of shape {list(x.shape)} (last axis must be {self.n_cols})"
            )
        if self.qtype == GGMLType.F32:
            return x @ self.raw.view(np.float32).T
        if x.ndim == 1 or x.shape[0] == 1:
            out = np.empty(self.n_rows, dtype=np.float32)
            vector = self.vector_kernel()  # the repacked copy's kernel, else the type's over the GGUF rows
            if vector is not None:
                vector(x.reshape(-1), out)
            else:
                dot_kernels.matvec_generic(*self._args(self.raw), x.reshape(-1), out)
            return out if x.ndim == 1 else out.reshape(1, -1)
        if x.shape[0] <= SMALL_BATCH:
            fast = self.repacked()
            if fast is not None:
                return repack.matmul(fast, x)
            out = np.empty((x.shape[0], self.n_rows), dtype=np.float32)
            args = self._args(self.raw)
            direct, small = kquant_rows.MATVEC.get(args[0]), dot_kernels.MATMUL_SMALL.get(args[0])
            if direct is not None:  # a row at a time, each as a decode step: faster than the block kernels
                for t in range(len(x)):
                    direct(self.raw, x[t], out[t])
            elif small is not None:
                small(*args[3:], x, out)
            else:
                dot_kernels.matmul_small_generic(*args, x, out)
            return out
        out = np.empty((x.shape[0], self.n_rows), dtype=np.float32)
        with _one_numba_thread():
            for rows, weights in self._float_chunks():
                np.matmul(x, weights.T, out=out[:, rows])
        return out

    def top_k(self, x: NDArray[np.float32], k: int) -> NDArray[np.int64]:
        """Per row of x `[t, n_cols]`, the ids of the k largest entries of x @ W.T `[t, k]` (descending;
        an equal value keeps the lower id), a chunk of weight rows at a time: the `[t, n_rows]`
        product is never held (an edit's candidate tokens over Gemma's 262k-row unembedding). A
        Q8_0 matrix on an int8 tier finds them from int8 scores on its tiled copy and ranks them by exact
        (float64) scores (topk_tiles.py; 2.3x), for TILED_TOP_K_ROWS rows or more or once the copy
        exists; the float32 path agrees up to its rounding (two scores within ~1e-6 may swap)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.n_cols:
            raise QuantError(f"{self.name}: top_k takes rows of {self.n_cols} values, not shape {list(x.shape)}")
        k = min(k, self.n_rows)
        if k <= 0:
            return np.zeros((len(x), 0), np.int64)
        if (self.qtype == GGMLType.Q8_0 and argmax.HAVE_TILED and len(x)
                and (len(x) >= TILED_TOP_K_ROWS or (self._tiled and self._tiled[0] is not None))):
            from larql.quant import topk_tiles  # only an edit's batches come here: not imported by `larql run`

            tiles = self.tiled()
            if tiles is not None and topk_tiles.in_range(tiles, x):
                return topk_tiles.top_k(tiles, self.raw, x, k)
        ids = np.zeros((len(x), k), np.uint32)
        vals = np.full((len(x), k), -np.inf, np.float32)
        scores = np.empty((len(x), min(CHUNK_ROWS, self.n_rows)), np.float32)
        with _one_numba_thread():
            for rows, weights in self._float_chunks():
                part = scores[:, : rows.stop - rows.start]
                np.matmul(x, weights.T, out=part)
                argmax.topk_update(part, rows.start, ids, vals)
        return ids.astype(np.int64)

    def top1(self, x: NDArray[np.float32], softcap: float = 0.0) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Per row of x `[t, n_cols]`: the id of the largest entry of x @ W.T — soft-capped first,
        cap * tanh(s / cap), where `softcap` is set — and its log-probability under the row's softmax
        `[t]` each: greedy decoding's token and its probability without holding the `[t, n_rows]`
        product (a batch of 256 probes over Gemma's 262k-row unembedding). The scores are `matmul`'s
        (its kernel for a small batch, the same chunks otherwise), so the id is argmax(matmul) exactly;
        the log-probability is summed in float64 a chunk at a time."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.n_cols:
            raise QuantError(f"{self.name}: top1 takes rows of {self.n_cols} values, not shape {list(x.shape)}")
        best = np.full(len(x), -np.inf, np.float32)
        ids = np.zeros(len(x), np.int64)
        total = np.zeros(len(x), np.float64)  # sum of exp(score - best) so far

        def update(scores: NDArray[np.float32], base: int) -> None:
            if softcap:
                cap = np.float32(softcap)
                scores = np.tanh(scores / cap) * cap  # forward.logits' formula, the same bits
            arg = scores.argmax(axis=1)
            top = scores[np.arange(len(x)), arg]
            better = top > best  # strictly: an equal score keeps the earlier (lower) id, as argmax
            new_best = np.maximum(best, top)
            total[:] = total * np.exp((best - new_best).astype(np.float64)) + np.exp(
                scores - new_best[:, None]).sum(axis=1, dtype=np.float64)
            ids[better] = base + arg[better]
            best[:] = new_best

        if len(x) <= SMALL_BATCH:
            update(self.matmul(x), 0)
        else:
            part = np.empty((len(x), min(CHUNK_ROWS, self.n_rows)), np.float32)
            with _one_numba_thread():
                for rows, weights in self._float_chunks():
                    scores = part[:, : rows.stop - rows.start]
                    np.matmul(x, weights.T, out=scores)
                    update(scores, rows.start)
        return ids, -np.log(total)

    def _float_chunks(self) -> Iterator[tuple[slice, NDArray[np.float32]]]:
        """The weights as float32, CHUNK_ROWS rows at a time (dequantized into a reused scratch)."""
        kept = self._dense[0]() if self._dense else None  # a dense() copy still held: no dequantization
        for start in range(0, self.n_rows, CHUNK_ROWS):
            rows = slice(start, min(start + CHUNK_ROWS, self.n_rows))
            if self.qtype == GGMLType.F32:
                yield rows, self.raw[rows].view(np.float32)
                continue
            if kept is not None:
                yield rows, kept[rows]
                continue
            scratch = _scratch_rows(rows.stop - start, self.n_cols)
            packed = self._repacked[0] if self._repacked else None  # made by a decode step before
            yield rows, (self.dequantize(rows, out=scratch) if packed is None
                         else repack.dequantize_into(packed, rows, scratch))
