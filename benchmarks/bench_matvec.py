"""Decode's one-activation matvec at real model shapes, per kernel, in GB/s of GGUF bytes read.

    python benchmarks/bench_matvec.py [--reps 7] [--types Q4_K,...] [--no-lm-head] [--token] [--tier avx2] [--name matvec]

Kernels, for each type and shape:
    blocks     the kernel decode ran over the GGUF blocks before the direct kernels (dot_kernels.py;
               Q5_K: the generic block-at-a-time one)
    repacked   the int8 + scale copy's kernel (repack.py, matvec_rows.py), timed on the copy; its
               GB/s counts the GGUF bytes (what the copy stands for), not the copy's larger size
    direct     the register-accumulator kernels over the GGUF blocks (kquant_rows.py; Q8_0: q8_0_rows.py)
Shapes (rows x columns, i.e. outputs x inputs): a 4B Gemma 3's FFN down (2560 x 10240) and up/gate
(10240 x 2560), its attention (2560 x 2560), a 1B's FFN down (1152 x 6912), and the 262,144 x 2560
lm_head for Q6_K and Q8_0. Blocks are random with finite f16 scales. Each shape is held in enough
copies (>= 256 MB in all) that a call reads its weights from memory, as a decode step does, not
from the 32 MB L3; the kernels run interleaved, --reps rounds over all copies, and the median time
per call is reported. The floor: a STREAM-like copy (numpy, one thread: bytes read + written) and a
read-only sum over numba's threads. Numba's thread count is the CLI's (2 here). The tier is recorded;
--tier avx2 reruns it with numba built for haswell (bench_topk_tiers.AVX2_BUILD: AVX2, FMA, F16C, no
AVX-512) for the AVX2 tier's figures on a newer CPU.
The load average is recorded before every shape (other work on the machine slows the figures).
--token adds one decode token of a 4B Gemma 3 at Q4_K_M: every weight matvec of its 34 layers and
lm_head (2.5 GB of blocks) per kernel, the same activation for every matrix of a width: the kernels'
share of a token against the bytes-per-token floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numba
import numpy as np
from bench_topk_tiers import AVX2_BUILD
from results_file import save_results

from larql.cli.benchmark import machine
from larql.quant import GGMLType, dot_kernels, kernels, kquant_rows, q8_0_rows, repack
from larql.quant.types import BLOCK_LAYOUT, row_bytes

F16_FIELDS = {GGMLType.Q4_0: [0], GGMLType.Q5_0: [0], GGMLType.Q8_0: [0], GGMLType.Q4_K: [0, 2], GGMLType.Q5_K: [0, 2],
              GGMLType.Q6_K: [208]}
SHAPES = [(2560, 10240), (10240, 2560), (2560, 2560), (1152, 6912)]
LM_HEAD = (262144, 2560)
COPIES_BYTES = 256 << 20


def random_blocks(qtype: GGMLType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes in qtype's layout with finite, small f16 scales."""
    _, type_size = BLOCK_LAYOUT[qtype]
    raw = rng.integers(0, 256, size=(rows, row_bytes(qtype, cols)), dtype=np.uint8)
    blocks = raw.reshape(-1, type_size)
    for off in F16_FIELDS[qtype]:
        halves = (rng.standard_normal(len(blocks)) * 0.01).astype(np.float16)
        blocks[:, off:off + 2] = halves.view(np.uint8).reshape(-1, 2)
    return raw


def kernels_for(qtype: GGMLType, raw: np.ndarray, cols: int) -> dict[str, Callable[[np.ndarray, np.ndarray], None]]:
    block_size, type_size = BLOCK_LAYOUT[qtype]
    tab = kernels.F16_TO_F32
    out: dict[str, Callable[[np.ndarray, np.ndarray], None]] = {}
    blocks = dot_kernels.MATVEC.get(int(qtype))
    out["blocks"] = (partial(blocks, raw, raw.view(np.int8), tab) if blocks is not None else
                     partial(dot_kernels.matvec_generic, int(qtype), block_size, type_size, raw, raw.view(np.int8), tab))
    if qtype in repack.REPACKABLE:
        out["repacked"] = repack.matvec_kernel(repack.repack(qtype, block_size, type_size, raw, tab, cols))
    direct = {GGMLType.Q5_0: kquant_rows.matvec_q5_0, GGMLType.Q4_K: kquant_rows.matvec_q4_k, GGMLType.Q5_K: kquant_rows.matvec_q5_k,
              GGMLType.Q6_K: kquant_rows.matvec_q6_k, GGMLType.Q4_0: kquant_rows.matvec_q4_0,
              GGMLType.Q8_0: q8_0_rows.matvec_q8_0}[qtype]
    out["direct"] = partial(direct, raw)
    return out


def floor_bandwidth(reps: int) -> dict[str, float]:
    """STREAM-like figures on 1 GB, best of reps: numpy's copy (one thread; bytes read + written) and
    numpy's sum of halves of it on numba's thread count of Python threads (numpy lets go of the GIL)."""
    a = np.ones((64, 1 << 22), np.float32)
    b = np.empty_like(a)
    threads = numba.get_num_threads()
    parts = np.array_split(a, threads)
    copy, read = [], []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(reps):
            t = time.perf_counter()
            np.copyto(b, a)
            copy.append(2 * a.nbytes / (time.perf_counter() - t) / 1e9)
            t = time.perf_counter()
            list(pool.map(np.sum, parts))
            read.append(a.nbytes / (time.perf_counter() - t) / 1e9)
    return {"copy_1_thread_gbs": max(copy), "read_threads_gbs": max(read)}


def bench_shape(qtype: GGMLType, rows: int, cols: int, reps: int, rng: np.random.Generator) -> dict[str, object]:
    gguf_bytes = rows * row_bytes(qtype, cols)
    copies = max(1, -(-COPIES_BYTES // gguf_bytes))
    mats = [random_blocks(qtype, rows, cols, rng) for _ in range(copies)]
    per_copy = [kernels_for(qtype, raw, cols) for raw in mats]
    x = rng.standard_normal(cols).astype(np.float32)
    out = np.empty(rows, np.float32)
    names = list(per_copy[0])
    want = np.empty(rows, np.float32)
    per_copy[0]["repacked" if "repacked" in names else "blocks"](x, want)
    for name in names:  # compile, and agree with each other
        per_copy[0][name](x, out)
        assert np.allclose(out, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max())), name
    times: dict[str, list[float]] = {n: [] for n in names}
    load = os.getloadavg()[0]
    for _ in range(reps):
        for name in names:  # interleaved: a burst of other work hits every kernel alike
            for ks in per_copy:
                t = time.perf_counter()
                ks[name](x, out)
                times[name].append(time.perf_counter() - t)
    result: dict[str, object] = {"type": qtype.name, "shape": [rows, cols], "gguf_mb": gguf_bytes / 1e6,
                                 "copies": copies, "load_before": load}
    for name in names:
        med = statistics.median(times[name])
        result[name] = {"median_us": med * 1e6, "gbs": gguf_bytes / med / 1e9}
    return result


# One decode token of a 4B Gemma 3 at Q4_K_M (llama.cpp's mix): per layer q, k, o, gate, up as Q4_K,
# v and down Q6_K on every other layer (Q4_K on the rest), and the tied 262,144-row Q6_K lm_head.
LAYERS_4B, HIDDEN_4B, FFN_4B = 34, 2560, 10240


def token_matrices(rng: np.random.Generator) -> list[tuple[GGMLType, int, int, np.ndarray]]:
    out = []
    for layer in range(LAYERS_4B):
        six = GGMLType.Q6_K if layer % 2 == 0 else GGMLType.Q4_K
        for qtype, rows, cols in ((GGMLType.Q4_K, 2048, HIDDEN_4B), (GGMLType.Q4_K, 1024, HIDDEN_4B),
                                  (six, 1024, HIDDEN_4B), (GGMLType.Q4_K, HIDDEN_4B, 2048),
                                  (GGMLType.Q4_K, FFN_4B, HIDDEN_4B), (GGMLType.Q4_K, FFN_4B, HIDDEN_4B),
                                  (six, HIDDEN_4B, FFN_4B)):
            out.append((qtype, rows, cols, random_blocks(qtype, rows, cols, rng)))
    out.append((GGMLType.Q6_K, *LM_HEAD, random_blocks(GGMLType.Q6_K, *LM_HEAD, rng)))
    return out


def bench_token(reps: int, rng: np.random.Generator) -> dict[str, object]:
    """The weight matvecs of one 4B decode token, each kernel over all of them in turn (interleaved
    per token), median seconds per token; the GGUF bytes a token reads over that time."""
    mats = token_matrices(rng)
    gguf_bytes = sum(raw.nbytes for *_, raw in mats)
    per = [kernels_for(qtype, raw, cols) for qtype, _, cols, raw in mats]
    xs = {c: rng.standard_normal(c).astype(np.float32) for c in {cols for _, _, cols, _ in mats}}
    outs = [np.empty(rows, np.float32) for _, rows, _, _ in mats]
    times: dict[str, list[float]] = {n: [] for n in per[0]}
    for rep in range(reps + 1):  # the first compiles and faults pages in
        for name in times:
            t = time.perf_counter()
            for (_, _, cols, _), ks, out in zip(mats, per, outs):
                ks[name](xs[cols], out)
            if rep:
                times[name].append(time.perf_counter() - t)
    result: dict[str, object] = {"model": "gemma3-4b shape, Q4_K_M mix", "gguf_mb": gguf_bytes / 1e6,
                                 "load_before": os.getloadavg()[0]}
    for name, ts in times.items():
        med = statistics.median(ts)
        result[name] = {"median_ms": med * 1e3, "tok_s": 1 / med, "gbs": gguf_bytes / med / 1e9}
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K,Q4_0,Q5_0,Q8_0")
    ap.add_argument("--no-lm-head", action="store_true")
    ap.add_argument("--name", default="matvec")
    ap.add_argument("--token", action="store_true", help="also one 4B decode token's matvecs (~6 GB of memory)")
    ap.add_argument("--tier", choices=("host", "avx2"), default="host",
                    help="avx2: rerun in a process with numba built for haswell (its own numba cache)")
    args = ap.parse_args()
    if args.tier == "avx2" and os.environ.get("NUMBA_CPU_NAME") != "haswell":
        env = dict(os.environ, **AVX2_BUILD, NUMBA_CACHE_DIR=tempfile.mkdtemp(prefix="numba-avx2-"))
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    rng = np.random.default_rng(0)
    rows_out = []
    for qtype in (GGMLType[t] for t in args.types.split(",")):
        shapes = SHAPES + ([LM_HEAD] if qtype in (GGMLType.Q6_K, GGMLType.Q8_0) and not args.no_lm_head else [])
        for rows, cols in shapes:
            r = bench_shape(qtype, rows, cols, args.reps, rng)
            rows_out.append(r)
            print(f"{r['type']:5} {rows:>6}x{cols:<6} " + "  ".join(
                f"{n} {r[n]['gbs']:5.1f} GB/s ({r[n]['median_us']:7.0f} us)"  # type: ignore[index]
                for n in ("blocks", "repacked", "direct") if n in r), flush=True)
    token = bench_token(args.reps, rng) if args.token else None
    if token is not None:
        print("4B token: " + "  ".join(f"{n} {token[n]['median_ms']:.0f} ms ({token[n]['gbs']:.1f} GB/s)"  # type: ignore[index]
                                       for n in ("blocks", "repacked", "direct")))
    floor = floor_bandwidth(5)
    print(f"floor: copy {floor['copy_1_thread_gbs']:.1f} GB/s (1 thread), read {floor['read_threads_gbs']:.1f} GB/s")
    path = save_results(args.name, {"machine": machine(), "floor": floor, "shapes": rows_out, "token_4b": token})
    print(path)


if __name__ == "__main__":
    main()
