"""Peak resident memory (RSS) of larql's commands, each in a fresh process, beside the sizes of the
files they read: extraction, `larql lql 'USE ...; INFER ...'`, `larql run`, and `larql --help` (the
interpreter's own floor).

    python benchmarks/bench_memory.py [--model gemma3-270m] [--workdir /tmp/larql-mem] [--level inference]

The weights are memory-mapped: a page of a file counts in RSS once it is touched, so RSS grows with
what a command reads, not with the file sizes. The peak is the kernel's high-water mark of the child
(its ru_maxrss, taken by a bare launcher process), mapped file pages included. Prints a table and writes
benchmarks/results/memory.json with the machine's description.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from results_file import save_results

from larql.cli.benchmark import machine

PROMPT = "The capital of France is"


# Runs the command from a bare interpreter (python -S: ~10 MiB) and prints the child's rusage. A child's
# ru_maxrss includes the memory of the process that forked it (the high-water mark survives exec), so
# forking from this script, which has numpy loaded, would put a ~100 MiB floor under every figure.
_LAUNCHER = """
import os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss, time.perf_counter() - t0)
"""


def peak(args: list[str]) -> tuple[float, float]:
    """(peak RSS in MiB, wall seconds) of `python -m larql ARGS` run to completion."""
    argv = [sys.executable, "-S", "-c", _LAUNCHER, sys.executable, "-m", "larql", *args]
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: nothing blocks while it runs
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, text=True, check=False).stdout
        code, maxrss, seconds = out.split()[-3:]
        if int(code) != 0:
            err.seek(0)
            raise SystemExit(f"larql {' '.join(args)} failed ({code}): {err.read().decode().strip()}")
    return int(maxrss) / 1024, float(seconds)  # ru_maxrss is in KiB on Linux


def size_mib(path: Path) -> float:
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--workdir", default="/tmp/larql-mem")
    parser.add_argument("--level", default="inference", choices=["browse", "inference"])
    args = parser.parse_args()
    from larql.model.load import resolve

    source = resolve(args.model)[1]
    vindex = Path(args.workdir) / f"{args.model}.vindex"
    vindex.parent.mkdir(parents=True, exist_ok=True)
    infer = f'USE "{vindex}"; INFER "{PROMPT}" TOP 3;'
    rows = []
    for label, cmd in (
        ("larql --help (interpreter floor)", ["--help"]),
        (f"larql extract {args.model} --level {args.level}",
         ["extract", args.model, "-o", str(vindex), "--level", args.level, "--force", "--quiet"]),
        (f"larql lql 'USE v; INFER \"{PROMPT}\" TOP 3'", ["lql", infer]),
        (f"larql run {args.model} (32 tokens)", ["run", args.model, PROMPT]),
    ):
        if "INFER" in label and args.level == "browse":
            continue
        rss, seconds = peak(cmd)
        rows.append({"command": label, "peak_rss_mib": round(rss, 1), "seconds": round(seconds, 1)})
        print(f"{label}: {rss:.0f} MiB peak, {seconds:.1f} s", file=sys.stderr)
    files = {"model_file_mib": round(size_mib(source), 1), "vindex_mib": round(size_mib(vindex), 1)}
    print(f"\n{args.model}: model file {files['model_file_mib']:.0f} MiB, {args.level} vindex "
          f"{files['vindex_mib']:.0f} MiB; load average {os.getloadavg()[0]:.1f}")
    print("| command | peak RSS | wall |\n|---|---:|---:|")
    for r in rows:
        print(f"| {r['command']} | {r['peak_rss_mib']:.0f} MiB | {r['seconds']:.1f} s |")
    out = save_results("memory", {"machine": machine(), "model": args.model, "level": args.level, **files,
                                  "runs": rows})
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
