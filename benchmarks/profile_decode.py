"""Where one greedy decode token's time goes, per operation and per weight type, beside llama.cpp.

    python benchmarks/profile_decode.py [--model /work/data/scale/gemma3-4b-q4_k_m.gguf] [--tokens 8]
        [--threads 2] [--ab] [--peer] [--name profile-decode-4b]

Loads the GGUF with larql, prefills a short prompt, decodes a few tokens untimed, then decodes
--tokens more with a timer around every call a decode step makes: each weight matvec (by role,
GGML type and shape, with its GB/s of GGUF bytes), the norms, the q/k step, attention, the gated
activation, the embedding, the final norm and the lm_head (a greedy step's argmax over the vocab).
What the timers do not cover is "python" (the loop, allocations, the timers themselves). The
machine's floor beside it: a STREAM-like copy's GB/s (bench_scale.copy_bandwidth) and the bytes
one token reads over it. --ab loads the model a second time with its Q4_K / Q6_K / Q5_0 matrices on
the one-row AVX2 forms decode ran before the AVX-512 ones (kquant_rows.matvec_*_one), one matrix a
parallel region (no kquant_pairs), and decodes a
token of each in turn, so that the machine's other work slows both alike (attention's one-thread
path for short contexts is in both). --peer times llama.cpp's greedy decode on the same file (bench_larql's
method, llama-cpp-python in a child process). Writes benchmarks/results/NAME.json with the CPU,
tier and load average.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from results_file import save_results

ROLES = ("q", "k", "v", "o", "gate", "up", "down")


class Timers:
    """Seconds and calls per key, and the bytes each key's calls read, into the Timers `ACTIVE` holds
    (one per model when two are compared)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)


ACTIVE: list[Timers] = [Timers()]


def timed(key: str, fn: Callable[..., Any], nbytes: int = 0) -> Callable[..., Any]:
    def call(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        r = fn(*a, **k)
        timers = ACTIVE[0]
        timers.seconds[key] += time.perf_counter() - t0
        timers.calls[key] += 1
        timers.bytes[key] += nbytes
        return r

    return call


def instrument_shared() -> None:
    """Timers around the module-level steps every model's decode step calls."""
    from larql.model import forward, fused, prefill_ops

    for name in ("rms_norm_rows", "decode_qk", "attend_one", "add_rms_norm_rows"):
        setattr(fused, name, timed(name, getattr(fused, name)))
    prefill_ops.gated_mul_into = timed("gated_mul", prefill_ops.gated_mul_into)
    forward.Forward.rope = timed("rope", forward.Forward.rope)  # type: ignore[method-assign]


def instrument(model: Any) -> None:
    """Timers around every matvec, the lm_head, embedding and final norm of the model's decode step
    (its DecodeLayers plan must exist: made by a first step)."""
    fwd = model._forward
    plan = fwd.decode_layers()
    assert plan is not None, "no direct decode plan for this model"
    for i, lw in enumerate(fwd.w.layers):
        args = plan.args[i]
        assert args is not None
        mats = [getattr(lw, r) for r in ROLES]
        wrapped = [timed(f"matvec {r} {m.qtype.name} {m.n_rows}x{m.n_cols}", k, m.nbytes)
                   for r, m, k in zip(ROLES, mats, args[0])]
        pairs = tuple(None if k is None else
                      timed(f"matvec {a}+{b} {ma.qtype.name} {ma.n_rows}+{mb.n_rows}x{ma.n_cols}", k, ma.nbytes + mb.nbytes)
                      for k, (a, b), (ma, mb) in zip(args[-1], (("q", "k"), ("gate", "up")),
                                                     ((lw.q, lw.k), (lw.gate, lw.up))))
        plan.args[i] = (wrapped, *args[1:-1], pairs)
    out = fwd.w.output
    head = f"lm_head argmax {out.qtype.name} {out.n_rows}x{out.n_cols}"
    argmax = out.argmax_matvec
    object.__setattr__(out, "argmax_matvec", timed(head, argmax, out.nbytes))  # this model's lm_head only
    fwd.embed = timed("embed", fwd.embed)
    fwd.final_norm = timed("final_norm", fwd.final_norm)


def loaded(path: str, one_row: bool, n: int) -> tuple[Any, Any, list[int], int]:
    """The model, a KV cache, the prompt ids and the next token after two warm decode steps; one_row:
    its Q4_K / Q6_K / Q5_0 matrices bound to the one-row AVX2 forms (kquant_rows.matvec_*_one, what
    decode ran before the AVX-512 forms), for an A/B in one process."""
    import larql
    from larql.cli.benchmark import prompt_ids
    from larql.quant import GGMLType, kquant_pairs, kquant_rows

    saved, pairs = dict(kquant_rows.MATVEC), dict(kquant_pairs.PAIR)
    if one_row:
        kquant_pairs.PAIR.clear()
        kquant_rows.MATVEC[int(GGMLType.Q4_K)] = kquant_rows.matvec_q4_k_one
        kquant_rows.MATVEC[int(GGMLType.Q6_K)] = kquant_rows.matvec_q6_k_one
        kquant_rows.MATVEC[int(GGMLType.Q5_0)] = kquant_rows.matvec_q5_0_one
    try:
        model = larql.load(path)
        ids = prompt_ids(model, 16)
        cache = model.new_cache(len(ids) + n + 8)
        tok = model.next_token(ids, cache)
        for _ in range(2):  # compiled, warm; each matrix's kernel bound (QuantMatrix.vector_kernel)
            tok = model.next_token([tok], cache)
    finally:
        kquant_rows.MATVEC.clear()
        kquant_rows.MATVEC.update(saved)
        kquant_pairs.PAIR.update(pairs)
    gate = model._forward.w.layers[0].gate
    if gate is not None and gate.qtype == GGMLType.Q4_K:
        bound = getattr(gate.vector_kernel(), "func", None)
        assert (bound is kquant_rows.matvec_q4_k_one) == one_row, bound
    return model, cache, ids, tok


def summary(timers: Timers, tokens: int, total_s: float, copy_gbs: float) -> dict[str, Any]:
    ops = {}
    for key in sorted(timers.seconds, key=lambda k: -timers.seconds[k]):
        s, b = timers.seconds[key], timers.bytes[key]
        ops[key] = {"ms_per_token": round(1e3 * s / tokens, 3), "calls_per_token": timers.calls[key] // tokens,
                    **({"gb_s": round(b / s / 1e9, 2), "of_copy": round(b / s / 1e9 / copy_gbs, 3)} if b else {})}
    covered = sum(timers.seconds.values())
    by_type: dict[str, dict[str, float]] = defaultdict(lambda: {"ms_per_token": 0.0, "bytes": 0})
    for key, s in timers.seconds.items():
        if key.startswith(("matvec", "lm_head")):
            part = key.split()
            group = f"{part[0]} {part[-2]}" if key.startswith("matvec") else "lm_head"
            by_type[group]["ms_per_token"] += 1e3 * s / tokens
            by_type[group]["bytes"] += timers.bytes[key] / tokens
    groups = {g: {"ms_per_token": round(v["ms_per_token"], 2), "mb_per_token": round(v["bytes"] / 1e6, 1),
                  "gb_s": round(v["bytes"] / v["ms_per_token"] / 1e6, 2)} for g, v in by_type.items()}
    return {"ms_per_token": round(1e3 * total_s / tokens, 2), "tok_s": round(tokens / total_s, 3),
            "python_other_ms_per_token": round(1e3 * (total_s - covered) / tokens, 2),
            "by_type": groups, "ops": ops}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="/work/data/scale/gemma3-4b-q4_k_m.gguf")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peer", action="store_true", help="time llama.cpp's decode on the same file")
    ap.add_argument("--ab", action="store_true",
                    help="also a second copy of the model on the one-row kernels, tokens interleaved")
    ap.add_argument("--name", default="profile-decode")
    args = ap.parse_args()

    from larql import threads

    threads.configure(args.threads)
    from bench_scale import copy_bandwidth, token_bytes

    from larql.cli.benchmark import bench_llamacpp, machine

    row: dict[str, Any] = {"model": Path(args.model).name, "load_average_start": [round(x, 2) for x in os.getloadavg()]}
    engines = {"current": loaded(args.model, False, args.tokens)}
    if args.ab:
        engines["one_row"] = loaded(args.model, True, args.tokens)
    instrument_shared()
    timers = {name: Timers() for name in engines}
    toks = {name: e[3] for name, e in engines.items()}
    seconds = dict.fromkeys(engines, 0.0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for model, *_ in engines.values():
        instrument(model)
    for _ in range(args.tokens):  # a token of each in turn: the machine's other work hits both alike
        for name, (model, cache, _, _) in engines.items():
            ACTIVE[0] = timers[name]
            t0 = time.perf_counter()
            toks[name] = model.next_token([toks[name]], cache)
            seconds[name] += time.perf_counter() - t0
    row["minor_faults_per_token"] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) // (
        args.tokens * len(engines))
    copy_gbs = copy_bandwidth(0.5)
    sizes = token_bytes(Path(args.model))
    row |= {"copy_gb_s": round(copy_gbs, 2), "bytes_per_token": sizes["bytes_per_token"],
            "floor_ms_per_token": round(sizes["bytes_per_token"] / copy_gbs / 1e6, 1),
            "same_tokens": len(set(toks.values())) == 1}
    for name in engines:
        row[name] = summary(timers[name], args.tokens, seconds[name], copy_gbs)
    if args.peer:
        ids = engines["current"][2]
        peer = bench_llamacpp(row["model"], args.model, ids, max(args.tokens, 16), args.threads)
        row["llama_cpp_decode_tok_s"] = round(peer.decode_tok_s, 3)
        row["llama_cpp_gb_s"] = round(sizes["bytes_per_token"] * peer.decode_tok_s / 1e9, 2)
    row["machine"] = machine()
    row["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(save_results(args.name, row), file=sys.stderr)
    print(f"{row['model']}: floor {row['floor_ms_per_token']} ms at copy {copy_gbs:.1f} GB/s; "
          f"llama.cpp {row.get('llama_cpp_decode_tok_s')} tok/s; load {row['load_average_start']} -> {row['load_average_end']}")
    for name in engines:
        r = row[name]
        print(f"{name}: {r['tok_s']} tok/s, {r['ms_per_token']} ms/token, python/other {r['python_other_ms_per_token']} ms")
        for g, v in r["by_type"].items():
            print(f"  {g:24s} {v['ms_per_token']:8.2f} ms  {v['mb_per_token']:8.1f} MB  {v['gb_s']:6.2f} GB/s")
        for k, v in r["ops"].items():
            if not k.startswith(("matvec", "lm_head")):
                print(f"  {k:40s} {v['ms_per_token']:8.3f} ms")


if __name__ == "__main__":
    main()
