"""`larql bench`: prefill and greedy-decode speed of larql beside llama.cpp on the same GGUF, in one run.

    larql bench [MODEL ...] [--prompt 256] [--decode 64] [--rounds 1] [--out FILE]

llama.cpp is measured through llama-cpp-python when it is installed; it is never a dependency. Without
it the larql rows are printed and one line says how to install it (exit code 0: larql's own figures
were measured). The table is the one docs/guide/performance.md shows; `benchmarks/bench_runtime.py` adds
transformers and the per-kernel table on top of this module.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from larql.errors import LarqlError

MODELS = ("gemma3-270m", "smollm2-135m")
LLAMA_CPP_INSTALL = "pip install llama-cpp-python"
_PEER_MARK = "larql-bench-peer:"  # the child's line with its figures (llama.cpp may print lines of its own)
PROMPT_TEXT = ("The history of the city begins with a small settlement on the river, where traders "
               "from the north and the south met to exchange salt, grain, wool and news. ")


@dataclass(frozen=True)
class EngineSpeed:
    """One engine's speed on one model: the medians over `rounds` (each round's figures kept, in order)."""

    model: str
    engine: str
    prefill_tok_s: float
    decode_tok_s: float
    prefill_rounds: tuple[float, ...] = ()
    decode_rounds: tuple[float, ...] = ()


def _medians(rounds: Sequence[EngineSpeed]) -> EngineSpeed:
    """The rounds of one engine on one model as one EngineSpeed: medians, each round kept."""
    import statistics

    pre, dec = tuple(r.prefill_tok_s for r in rounds), tuple(r.decode_tok_s for r in rounds)
    return EngineSpeed(rounds[0].model, rounds[0].engine, statistics.median(pre), statistics.median(dec), pre, dec)


def machine() -> dict[str, Any]:
    """What the figures were measured on (printed and saved beside them)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    import numba

    from larql.quant import isa

    # the int8 kernels' tier, and the CPU numba compiled for when not this one (NUMBA_CPU_NAME)
    target = {"numba_cpu": os.environ["NUMBA_CPU_NAME"]} if os.environ.get("NUMBA_CPU_NAME") else {}
    return {"platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(), "isa": isa.TIER, **target,
            "threads": numba.get_num_threads(), "python": sys.version.split()[0], "numba": numba.__version__,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def prompt_ids(model: Any, n: int) -> list[int]:
    """The first n token ids of a fixed English text (BOS first), for every engine alike."""
    ids = list(model.tokenize(PROMPT_TEXT * 40))
    if len(ids) < n:
        raise LarqlError(f"--prompt {n}: the benchmark text has only {len(ids)} tokens for this model")
    return ids[:n]


def _seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_larql(key: str, ids: list[int], n_decode: int, model: Any) -> EngineSpeed:
    """Prefill: best of two full forward passes over ids. Decode: n_decode greedy steps on a KV cache
    (`Model.next_token`, what `generate` runs: the argmax of the logits, most of which it skips)."""
    model.check_fits(ids, n_decode)
    warm = model.new_cache(10)  # prefill and decode kernels compiled (or loaded from numba's cache) untimed
    model.next_logits(ids[:8], warm)
    model.next_logits(ids[8:9], warm)
    model.next_token(ids[9:10], warm)
    tiled = getattr(model.weights.output, "tiled", None)
    if tiled is not None:
        tiled()  # the greedy lm_head's copy, made from a long generation's 33rd step on: steady state timed
    prefill = min(_seconds(lambda: model.next_logits(ids)) for _ in range(2))
    cache = model.new_cache(len(ids) + n_decode)
    tok = model.next_token(ids, cache)  # greedy: np.argmax of the logits, without computing them all
    t0 = time.perf_counter()
    for _ in range(n_decode):
        tok = model.next_token([tok], cache)
    return EngineSpeed(key, "larql", len(ids) / prefill, n_decode / (time.perf_counter() - t0))


def llama_cpp_version() -> str | None:
    """llama-cpp-python's version, or None when it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return str(getattr(llama_cpp, "__version__", "?"))


def llama_cpp_system() -> str | None:
    """How the installed llama.cpp was built (`llama_print_system_info`: "CPU : SSE3 = 1 | ... | AVX512 = 0
    | ..."), or None when llama-cpp-python is not installed. The benchmark's child process imports the
    same build (it inherits this environment), so this names the instruction set the peer ran."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return str(llama_cpp.llama_print_system_info().decode().strip())


def llama_cpp_tier(system: str) -> str:
    """The widest x86 integer-dot form a llama.cpp build uses, from its system info, in the names of
    larql's tiers (larql/quant/isa.py) plus "avx512" (AVX-512 without VNNI) and "avxvnni" (the VEX
    VNNI of client CPUs); "other" for a build with none of them (e.g. ARM, or SSE only)."""
    # "CPU : SSE3 = 1 | AVX2 = 1 | ...": the backend's name prefixes the first flag
    flags = {k.split(":")[-1].strip(): v.strip() == "1" for k, _, v in
             (part.partition("=") for part in system.split("|")) if v.strip()}
    for flag, tier in (("AVX512_VNNI", "avx512vnni"), ("AVX512", "avx512"), ("AVX_VNNI", "avxvnni"), ("AVX2", "avx2")):
        if flags.get(flag):
            return tier
    return "other"


def llama_last_logits(llm: Any) -> Any:
    """llama-cpp-python's logits for the last evaluated token. `Llama.scores` stays zero unless
    logits_all=True (sampling moved into its sampler), and logits_all would make llama.cpp compute
    the lm_head for every prompt position, so the context is read directly."""
    import numpy as np

    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float32)


def bench_llamacpp(key: str, path: str, ids: list[int], n_decode: int, threads: int) -> EngineSpeed:
    """The same prompt ids and greedy decode through llama.cpp (llama-cpp-python must be installed),
    in a child process with the environment this one started with (threads.user_environ): llama.cpp's
    ggml and numba share GNU libgomp, which reads its wait policy once per process, so in this
    process llama.cpp would run under larql's thread settings, not its own (a passive OpenMP wait
    there halved llama.cpp's decode speed).
    Raises RuntimeError with the child's last line of error output if llama.cpp cannot load or run."""
    from larql.threads import user_environ

    code = ("import json, sys; from larql.cli.benchmark import llamacpp_speed; "
            f"print({_PEER_MARK!r}, json.dumps(llamacpp_speed(*json.loads(sys.argv[1]))))")
    try:
        r = subprocess.run([sys.executable, "-c", code, json.dumps([path, ids, n_decode, threads])],
                           env=user_environ(), capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"llama.cpp's process did not finish in {e.timeout:.0f} s") from e
    marked = [ln.split(" ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith(_PEER_MARK + " ")]
    if r.returncode != 0 or not marked:
        lines = [ln for ln in (r.stderr + r.stdout).strip().splitlines() if ln.strip()]
        raise RuntimeError(lines[-1] if lines else f"llama.cpp's process exited with code {r.returncode}")
    prefill, decode = json.loads(marked[-1])
    return EngineSpeed(key, "llama.cpp", prefill, decode)


def llamacpp_speed(path: str, ids: list[int], n_decode: int, threads: int) -> tuple[float, float]:
    """(prefill, decode) tok/s of llama.cpp in this process: prefill the best of two evaluations of ids,
    decode n_decode greedy steps (the argmax of its logits, as a user of llama-cpp-python does)."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=len(ids) + n_decode + 8,
                n_batch=512, verbose=False)
    llm.eval(ids[:8])
    times = []
    for _ in range(2):
        llm.reset()
        times.append(_seconds(lambda: llm.eval(ids)))
    t0 = time.perf_counter()
    for _ in range(n_decode):
        llm.eval([int(np.argmax(llama_last_logits(llm)))])
    return len(ids) / min(times), n_decode / (time.perf_counter() - t0)


def run_bench(models: Sequence[str], n_prompt: int, n_decode: int, peers: bool = True,
              progress: Callable[[str], None] | None = None, rounds: int = 1) -> dict[str, Any]:
    """Measure every model with larql and, if installed and `peers`, llama.cpp, `rounds` times in turn
    (larql, then llama.cpp, then larql again...: on a shared machine the neighbours' load moves both
    alike within a round), each engine's figures the medians over its rounds.

    Returns {"machine", "prompt", "decode", "rounds", "llama_cpp" (version or None), "llama_cpp_system"
    and "llama_cpp_tier" (how that build was compiled, when measured), "engines": [EngineSpeed as
    dicts], "peer_errors": {model: why llama.cpp could not load or run it}, "load_average_end"} (the
    machine's load average at the start is in "machine").

    Example:
        >>> r = run_bench(["smollm2-135m"], n_prompt=64, n_decode=16)
        >>> print(table(r["engines"]))
    """
    import larql
    from larql.model.load import resolve

    version = llama_cpp_version() if peers else None
    info = machine()
    engines: list[EngineSpeed] = []
    peer_errors: dict[str, str] = {}  # model -> why llama.cpp could not run it
    for key in models:
        model = larql.load(key)
        ids = prompt_ids(model, n_prompt)
        path = resolve(key)[1]
        ours: list[EngineSpeed] = []
        theirs: list[EngineSpeed] = []
        for r in range(rounds):
            at = f" (round {r + 1} of {rounds})" if rounds > 1 else ""
            if progress:
                progress(f"{key}: larql{at}")
            ours.append(bench_larql(key, ids, n_decode, model))
            if version is not None and path.is_file() and path.suffix == ".gguf" and key not in peer_errors:
                if progress:
                    progress(f"{key}: llama.cpp{at}")
                try:
                    theirs.append(bench_llamacpp(key, str(path), ids, n_decode, info["threads"]))
                except (ValueError, RuntimeError, OSError) as e:  # e.g. an architecture llama.cpp does not know
                    peer_errors[key] = f"{type(e).__name__}: {e}"
        engines.append(_medians(ours))
        if theirs and key not in peer_errors:
            engines.append(_medians(theirs))
    # the peer's instruction set: a llama.cpp built for an older CPU (no AVX-512, say) runs that tier here
    system = llama_cpp_system() if version is not None else None
    build = {"llama_cpp_system": system, "llama_cpp_tier": llama_cpp_tier(system)} if system else {}
    return {"machine": info, "prompt": n_prompt, "decode": n_decode, "rounds": rounds, "llama_cpp": version, **build,
            "engines": [asdict(e) for e in engines], "peer_errors": peer_errors,
            "load_average_end": [round(x, 2) for x in os.getloadavg()]}


def table(engines: Sequence[dict[str, Any]]) -> str:
    """The speed table (markdown), decode compared with llama.cpp on the same model. Figures
    over several rounds are their medians, followed by the lowest and highest round."""
    lines = ["| model | engine | prefill tok/s | decode tok/s | decode vs llama.cpp |",
             "|---|---|---:|---:|---:|"]

    def cell(median: float, rounds: Sequence[float], digits: int) -> str:
        spread = f" ({min(rounds):.{digits}f}-{max(rounds):.{digits}f})" if len(rounds) > 1 else ""
        return f"{median:.{digits}f}{spread}"

    for e in engines:
        ref = next((x for x in engines if x["model"] == e["model"] and x["engine"] == "llama.cpp"), None)
        ratio = f"{e['decode_tok_s'] / ref['decode_tok_s']:.2f}x" if ref else "—"
        lines.append(f"| {e['model']} | {e['engine']} | {cell(e['prefill_tok_s'], e.get('prefill_rounds', ()), 0)} | "
                     f"{cell(e['decode_tok_s'], e.get('decode_rounds', ()), 1)} | {ratio} |")
    return "\n".join(lines)


def describe_run(result: dict[str, Any]) -> str:
    """One line: what was measured, on what."""
    m = result["machine"]
    rounds = result.get("rounds", 1)
    over = f", medians of {rounds} rounds in turn" if rounds > 1 else ""
    tiers = f", larql tier {m['isa']}" if "isa" in m else ""
    if "llama_cpp_tier" in result:
        tiers += f", llama.cpp built for {result['llama_cpp_tier']}"
    return (f"prefill {result['prompt']} tokens, greedy decode {result['decode']} tokens{over}; {m['cpu']}, "
            f"{m['cpus']} cpus, {m['threads']} threads{tiers}, load average {m['load_average'][0]}"
            + (f" -> {result['load_average_end'][0]}" if "load_average_end" in result else ""))
