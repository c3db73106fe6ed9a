"""Runtime speed: prefill and decode tok/s for larql, llama.cpp and HF transformers, side by side,
plus GB/s of every quant matvec kernel against the machine's memory read bandwidth.

    python benchmarks/bench_runtime.py [--threads 2] [--models gemma3-270m smollm2-135m] [--decode 64]

larql and llama.cpp are measured by larql/cli/benchmark.py (the same code as `larql bench`); this script adds
transformers and the kernel table. Prints tables and writes benchmarks/results/runtime.json. Peers are
measured only when installed (`pip install llama-cpp-python`, `pip install torch==2.13.0 transformers`);
they are never runtime dependencies.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

from larql.threads import configure

configure()  # before numpy starts OpenBLAS; main() applies --threads on top

import numpy as np  # noqa: E402
from results_file import with_tier  # noqa: E402

from larql.cli.benchmark import describe_run, prompt_ids, run_bench, table  # noqa: E402
from larql.model.forward import Segment  # noqa: E402
from larql.quant import argmax, q8_bounds  # noqa: E402


def bench_transformers(key: str, n_prompt: int, n_decode: int, threads: int) -> dict[str, float] | None:
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    import larql
    from larql.model.load import resolve

    torch.set_num_threads(threads)
    path = resolve(key)[1]
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except (ImportError, ValueError) as e:  # e.g. transformers' GGUF loading wants `accelerate`
        print(f"transformers not measured on {key}: {e}")
        return None
    ids = torch.tensor([prompt_ids(larql.load(key), n_prompt)])
    with torch.no_grad():
        model(ids[:, :8])
        prefill = min(_time(lambda: model(ids)) for _ in range(2))
        out = model(ids, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(n_decode):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        decode = time.perf_counter() - t0
    return {"prefill_tok_s": n_prompt / prefill, "decode_tok_s": n_decode / decode}


def memory_bandwidth() -> float:
    """GB/s of a parallel float32 read (the ceiling for a memory-bound matvec)."""
    from numba import njit, prange

    @njit(parallel=True, fastmath=True)
    def read(a: np.ndarray) -> float:  # a long scalar reduction per row: LLVM vectorizes it fully
        sums = np.zeros(a.shape[0], dtype=np.float32)
        for r in prange(a.shape[0]):
            acc = np.float32(0.0)
            for i in range(a.shape[1]):
                acc += a[r, i]
            sums[r] = acc
        return float(sums.sum())

    a = np.ones((16384, 4096), dtype=np.float32)  # 256 MB, far beyond the caches
    read(a)
    return a.nbytes / min(_time(lambda: read(a)) for _ in range(5)) / 1e9


def kernel_speeds(keys: list[str]) -> list[dict[str, object]]:
    import larql

    rows = []
    for key in keys:
        m = larql.load(key)
        seen = set()
        layer = m.weights.layers[1]
        for mat in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down, m.weights.output):
            if (mat.qtype, mat.shape) in seen:
                continue
            seen.add((mat.qtype, mat.shape))
            x = np.random.default_rng(0).standard_normal(mat.n_cols).astype(np.float32)
            mat.matmul(x)
            reps = 3 if mat.nbytes > 50e6 else 50
            dt = min(_time(lambda mat=mat, x=x: mat.matmul(x)) for _ in range(reps))
            rows.append({"model": key, "tensor": mat.name, "type": mat.qtype.name, "shape": list(mat.shape),
                         "us": dt * 1e6, "GB_s": mat.nbytes / dt / 1e9})
        # greedy decoding's lm_head (quant/argmax.py) on a real final-norm activation: the int8 candidate
        # pass over every row and the exact rescoring of the few candidates
        out = m.weights.output
        h = m._forward.final_norm(m._forward.run([Segment(0, 8, m.new_cache(8), 0)], np.asarray(
            prompt_ids(m, 8)), None)[-1], None, 0)  # (hidden,)
        out.argmax_matvec(h)
        dt = min(_time(lambda out=out, h=h: out.argmax_matvec(h)) for _ in range(5))
        rows.append({"model": key, "tensor": out.name + " argmax", "type": out.qtype.name, "shape": list(out.shape),
                     "us": dt * 1e6, "GB_s": out.nbytes / dt / 1e9})
        # its candidate pass alone: on the tiled copy (what argmax_matvec runs) and on the GGUF rows
        tiled, norms = out.tiled(), out._row_norms[0] if out._row_norms else None
        if argmax.HAVE_VNNI and tiled is not None and norms is not None:
            c = 1.01 * (out.n_cols + 2) * q8_bounds.U
            for label, fn in (("candidates, tiled", partial(tiled.candidates, h, c)),
                              ("candidates, rows", partial(argmax.candidate_rows, out.raw, norms, h))):
                fn()
                dt = min(_time(fn) for _ in range(5))
                rows.append({"model": key, "tensor": f"{out.name} {label}", "type": out.qtype.name,
                             "shape": list(out.shape), "us": dt * 1e6, "GB_s": out.nbytes / dt / 1e9})
    return rows


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None,
                        help="worker threads (default: as the CLI, every core, see larql/threads.py)")
    parser.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2-135m"])
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="larql and llama.cpp in turn N times; medians")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "runtime.json"))
    args = parser.parse_args()
    threads = configure(args.threads)  # the thread pools as `larql` sets them, before numba and BLAS start
    results = run_bench(args.models, args.prompt, args.decode, rounds=args.rounds)
    engines = results["engines"]
    for key in args.models:
        r = bench_transformers(key, args.prompt, args.decode, threads)
        if r is not None:
            engines.append({"model": key, "engine": "transformers f32", **r})
    bw = memory_bandwidth()
    results["memory_read_GB_s"] = bw
    results["kernels"] = kernel_speeds(args.models)

    print(f"\n{describe_run(results)}")
    print(table(engines))
    print(f"\nquant matvec kernels (memory read bandwidth: {bw:.1f} GB/s)")
    print(f"{'model':14s} {'tensor':28s} {'type':6s} {'shape':>14s} {'us':>9s} {'GB/s':>7s} {'of bw':>6s}")
    for k in results["kernels"]:
        print(f"{k['model']:14s} {k['tensor']:28s} {k['type']:6s} {tuple(k['shape'])!s:>14s} "
              f"{k['us']:9.1f} {k['GB_s']:7.2f} {k['GB_s'] / bw:6.0%}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(with_tier(results), indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
