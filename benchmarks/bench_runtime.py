"""Runtime speed: prefill and decode tok/s for larql, llama.cpp and HF transformers, side by side,
plus GB/s of every quant matvec kernel against the machine's memory read bandwidth.

    python benchmarks/bench_runtime.py [--threads 2] [--models gemma3-270m smollm2-135m] [--decode 64]

Prints tables and writes benchmarks/results/runtime.json. Peers are measured only when installed
(`pip install llama-cpp-python`, `pip install torch==2.13.0 transformers`); they are never runtime
dependencies.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from peers import llama_last_logits

PROMPT_TEXT = ("The history of the city begins with a small settlement on the river, where traders "
               "from the north and the south met to exchange salt, grain, wool and news. ")


def prompt_ids(model, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    ids = model.tokenize(PROMPT_TEXT * 40)
    return ids[:n]


def bench_larql(key: str, n_prompt: int, n_decode: int) -> dict[str, float]:
    import larql

    m = larql.load(key)
    ids = prompt_ids(m, n_prompt)
    m.next_logits(ids[:8])  # compile / warm the kernels outside the timings
    best_prefill = min(_time(lambda: m.next_logits(ids)) for _ in range(2))
    cache = m.new_cache(len(ids) + n_decode)
    logits = m.next_logits(ids, cache)
    t0 = time.perf_counter()
    for _ in range(n_decode):
        logits = m.next_logits([int(np.argmax(logits))], cache)
    decode = time.perf_counter() - t0
    return {"prefill_tok_s": n_prompt / best_prefill, "decode_tok_s": n_decode / decode}


def bench_llamacpp(key: str, n_prompt: int, n_decode: int, threads: int) -> dict[str, float] | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    import larql
    from larql.model.load import resolve

    ids = prompt_ids(larql.load(key), n_prompt)
    llm = Llama(model_path=str(resolve(key)[1]), n_threads=threads, n_threads_batch=threads,
                n_ctx=n_prompt + n_decode + 8, n_batch=512, verbose=False)
    llm.eval(ids[:8])
    llm.reset()
    times = []
    for _ in range(2):
        llm.reset()
        times.append(_time(lambda: llm.eval(ids)))
    t0 = time.perf_counter()
    for _ in range(n_decode):
        tok = int(np.argmax(llama_last_logits(llm)))
        llm.eval([tok])
    decode = time.perf_counter() - t0
    return {"prefill_tok_s": n_prompt / min(times), "decode_tok_s": n_decode / decode}


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
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
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
            dt = min(_time(lambda: mat.matmul(x)) for _ in range(reps))
            rows.append({"model": key, "tensor": mat.name, "type": mat.qtype.name, "shape": list(mat.shape),
                         "us": dt * 1e6, "GB_s": mat.nbytes / dt / 1e9})
    return rows


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2-135m"])
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "runtime.json"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import numba

    numba.set_num_threads(args.threads)
    results: dict[str, object] = {"machine": {"platform": platform.platform(), "python": sys.version.split()[0],
                                              "cpus": os.cpu_count(), "threads": args.threads,
                                              "numba": numba.__version__}}
    engines = []
    for key in args.models:
        for engine, fn in (("larql", lambda: bench_larql(key, args.prompt, args.decode)),
                           ("llama.cpp", lambda: bench_llamacpp(key, args.prompt, args.decode, args.threads)),
                           ("transformers f32", lambda: bench_transformers(key, args.prompt, args.decode, args.threads))):
            r = fn()
            if r is not None:
                engines.append({"model": key, "engine": engine, **r})
    results["engines"] = engines
    bw = memory_bandwidth()
    results["memory_read_GB_s"] = bw
    results["kernels"] = kernel_speeds(args.models)

    print(f"\nprefill {args.prompt} tokens, greedy decode {args.decode} tokens, {args.threads} threads")
    print(f"{'model':14s} {'engine':18s} {'prefill tok/s':>14s} {'decode tok/s':>13s} {'decode vs llama.cpp':>20s}")
    for e in engines:
        ref = next((x for x in engines if x["model"] == e["model"] and x["engine"] == "llama.cpp"), None)
        ratio = f"{e['decode_tok_s'] / ref['decode_tok_s']:.2f}x" if ref else "-"
        print(f"{e['model']:14s} {e['engine']:18s} {e['prefill_tok_s']:14.1f} {e['decode_tok_s']:13.1f} {ratio:>20s}")
    print(f"\nquant matvec kernels (memory read bandwidth: {bw:.1f} GB/s)")
    print(f"{'model':14s} {'tensor':28s} {'type':6s} {'shape':>14s} {'us':>9s} {'GB/s':>7s} {'of bw':>6s}")
    for k in results["kernels"]:  # type: ignore[union-attr]
        print(f"{k['model']:14s} {k['tensor']:28s} {k['type']:6s} {str(tuple(k['shape'])):>14s} "
              f"{k['us']:9.1f} {k['GB_s']:7.2f} {k['GB_s'] / bw:6.0%}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
