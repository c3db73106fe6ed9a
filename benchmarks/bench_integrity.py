"""What checking a vindex costs, and what it catches, on a real extracted vindex.

    python benchmarks/bench_integrity.py g.vindex

Measures hash throughput (hashlib's sha256 and blake2b; xxhash if installed, for comparison),
the first open with an empty hash cache, a re-open, `verify` (every file read again); then the
corruption matrix: 64 flipped bytes in each file and hand edits of index.json and weights.json,
each on a hard-linked copy (changed files are rewritten, never edited in place), counting the
ones that are answered instead of refused. Writes benchmarks/results/integrity.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from results_file import save_results

from larql.errors import LarqlError
from larql.vindex.store import open_vindex


def throughput(mb: int = 256) -> dict[str, float]:
    data = os.urandom(mb << 20)
    out = {}
    makers: dict[str, Callable[[], Any]] = {"sha256": hashlib.sha256, "blake2b": hashlib.blake2b}
    try:
        import xxhash

        makers["xxh3_128"] = xxhash.xxh3_128
    except ImportError:
        pass
    for name, make in makers.items():
        h, view, t = make(), memoryview(data), time.perf_counter()
        for i in range(0, len(data), 1 << 22):
            h.update(view[i:i + (1 << 22)])
        out[name] = round(len(data) / (time.perf_counter() - t) / 1e6)
    return out


def _copy(src: Path, dst: Path) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir()
    for f in src.iterdir():
        os.link(f, dst / f.name)


def _rewrite(path: Path, data: bytes) -> None:
    path.unlink()  # break the hard link first: the original must stay intact
    path.write_bytes(data)


def tamperings(v: Any) -> dict[str, Callable[[Path], None]]:
    def flip(name: str) -> Callable[[Path], None]:
        def run(d: Path) -> None:
            data = bytearray((d / name).read_bytes())
            for k in range(64):
                data[(12345 + k * 40_961) % len(data)] ^= 0xFF
            _rewrite(d / name, bytes(data))
        return run

    def index(change: Callable[[dict[str, Any]], object]) -> Callable[[Path], None]:
        def run(d: Path) -> None:
            i = json.loads((d / "index.json").read_text())
            change(i)
            _rewrite(d / "index.json", json.dumps(i, indent=1).encode())
        return run

    def swap_offsets(d: Path) -> None:
        m = json.loads((d / "weights.json").read_text())
        a, b = next((x, y) for x in m for y in m if x is not y and x["nbytes"] == y["nbytes"])
        a["offset"], b["offset"] = b["offset"], a["offset"]
        _rewrite(d / "weights.json", json.dumps(m, indent=0).encode())

    cases = {f"64 bytes flipped in {name}": flip(name) for name in sorted(v.index["files"])}
    cases |= {
        "embed_scale x 1.01": index(lambda i: i.update(embed_scale=i["embed_scale"] * 1.01)),
        "embed_scale x 1.01 (both copies)": index(lambda i: (i.update(embed_scale=i["embed_scale"] * 1.01),
                                                             i["model_config"].update(embed_scale=i["embed_scale"]))),
        "rope_base 1e6 -> 1e4": index(lambda i: i["model_config"].update(rope_base=10_000.0)),
        "layer 3 num_features - 1": index(lambda i: i["layers"][3].update(num_features=i["layers"][3]["num_features"] - 1)),
        "two tensor offsets swapped in weights.json": swap_offsets,
    }
    return cases


def main(path: Path) -> None:
    os.environ["LARQL_CACHE"] = tempfile.mkdtemp(prefix="larql-bench-cache-")  # an empty hash cache
    speeds = throughput()
    t = time.perf_counter()
    v = open_vindex(path)
    first = time.perf_counter() - t
    t = time.perf_counter()
    open_vindex(path)
    again = time.perf_counter() - t
    t = time.perf_counter()
    bad = v.verify()
    verify = time.perf_counter() - t
    size = sum(e["size"] for e in v.index["files"].values())
    work = Path(tempfile.mkdtemp(prefix="larql-bench-")) / "t.vindex"
    matrix = {}
    for label, change in tamperings(v).items():
        _copy(path, work)
        change(work)
        try:
            open_vindex(work)
            matrix[label] = "ANSWERED"
        except LarqlError as e:
            matrix[label] = str(e).split("; ")[0].replace(str(work), "<copy>")[:110]  # the fix hint left out
    shutil.rmtree(work.parent)
    answered = sum(1 for r in matrix.values() if r == "ANSWERED")
    result = {"vindex": str(path), "bytes": size, "hash_mb_per_s": speeds, "first_open_s": round(first, 3),
              "reopen_ms": round(again * 1e3, 1), "verify_s": round(verify, 3), "verify_bad": bad,
              "corruptions": len(matrix), "answered": answered, "matrix": matrix}
    print(f"hash MB/s: {speeds}")
    print(f"{size / 1e6:.0f} MB: first open {first:.2f} s, re-open {again * 1e3:.1f} ms, verify {verify:.2f} s")
    for label, r in matrix.items():
        print(f"  {label:45s} {r}")
    print(f"{len(matrix)} corruptions, {answered} answered")
    print(f"wrote {save_results('integrity', result)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
