"""Vindex speed: extraction of gemma3-270m, open time, gate KNN per layer (also on a synthetic
vindex with Gemma-3-4B shapes: 34 layers x 10,240 features x 2,560 hidden, f16) and DESCRIBE latency.

    python benchmarks/bench_vindex.py [--skip-extract --vindex g.vindex] [--threads 2]

Prints a table and writes benchmarks/results/vindex.json. LARQL's published gate KNN: ~2.7 ms/layer
on Gemma-3-4B (its README; 0.98 ms/layer in its spec).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from results_file import save_results

import larql

LARQL_KNN_MS = 2.7


def synthetic_4b(path: Path, layers: int = 34, features: int = 10240, hidden: int = 2560, vocab: int = 4096) -> Path:
    """A vindex with Gemma-3-4B gate shapes (random f16 gates, a small vocabulary)."""
    from tokenizers import Tokenizer, models

    import larql
    from larql.vindex import layout
    from larql.vindex.writer import VindexWriter

    rng = np.random.default_rng(0)
    with VindexWriter(path, overwrite=True) as w:
        tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
        w.text(layout.TOKENIZER_FILE, tok.to_str())
        w.binary(layout.EMBEDDINGS_FILE).write((rng.standard_normal((vocab, hidden)) * 0.05).astype(np.float16))
        gates, meta = w.binary(layout.GATE_FILE), w.binary(layout.DOWN_META_FILE)
        meta.write((layout.DOWN_META_MAGIC + np.array([1, layers, 10], "<u4").tobytes()).ljust(64, b"\0"))
        entries = []
        for layer in range(layers):
            g = (rng.standard_normal((features, hidden)) * 0.02).astype(np.float16)
            go = gates.write_aligned(g)
            ids = rng.integers(0, vocab, size=(features, 10)).astype(np.uint32)
            mo = meta.write_aligned(ids)
            meta.write(np.sort(rng.random((features, 10)).astype(np.float32))[:, ::-1].copy())
            entries.append({"layer": layer, "num_features": features, "gate_offset": go, "gate_length": g.nbytes,
                            "down_meta_offset": mo, "down_meta_length": features * 80})
        index = {"format": layout.FORMAT_NAME, "version": 1, "larql_version": larql.__version__, "model": "synthetic-4b",
                 "family": "gemma3", "source": {"path": "synthetic", "sha256": "0" * 64, "size": 0,
                                                "extracted_at": "2026-01-01T00:00:00+00:00"},
                 "extract_level": "browse", "dtype": "f16", "quant": "none", "num_layers": layers, "hidden_size": hidden,
                 "intermediate_size": features, "vocab_size": vocab, "embed_scale": hidden ** 0.5, "down_top_k": 10,
                 "has_model_weights": False, "layer_bands": layout.layer_bands(layers), "layers": entries,
                 "model_config": {"arch": "gemma3", "n_layers": layers, "hidden": hidden, "ffn": features, "n_heads": 8,
                                  "n_kv_heads": 4, "head_dim": 256, "vocab": vocab, "embed_scale": hidden ** 0.5,
                                  "global_layers": [(i + 1) % 6 == 0 for i in range(layers)]},
                 "tokenizer": {"bos_id": None, "eos_ids": []}}
        return w.finish(index)


def knn_ms(v, queries: np.ndarray, k: int = 10) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(first-touch ms per layer including index build, steady-state median ms per layer)."""
    t0 = time.perf_counter()
    for layer in range(v.num_layers):
        v.gate_knn(layer, queries[0], k)
    first = (time.perf_counter() - t0) / v.num_layers * 1e3
    times = []
    for q in queries[1:]:
        for layer in range(v.num_layers):
            t = time.perf_counter()
            v.gate_knn(layer, q, k)
            times.append(time.perf_counter() - t)
    return first, float(np.median(times) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vindex", help="an existing inference-level gemma3-270m vindex")
    parser.add_argument("--skip-extract", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import faiss
    import numba

    from larql.vindex.describe import describe
    from larql.vindex.extract import extract
    from larql.vindex.store import open_vindex

    numba.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp())
    results: dict[str, object] = {"threads": args.threads}
    if not args.skip_extract:
        for level in ("browse", "inference"):
            t0 = time.perf_counter()
            extract("gemma3-270m", tmp / f"g-{level}.vindex", level=level)
            results[f"extract_{level}_s"] = time.perf_counter() - t0
        vindex_path = tmp / "g-inference.vindex"
    else:
        vindex_path = Path(args.vindex)
    t0 = time.perf_counter()
    v = open_vindex(vindex_path)
    results["open_ms"] = (time.perf_counter() - t0) * 1e3
    rng = np.random.default_rng(1)
    queries = [v.entity_embedding(w) for w in ("France", "Mozart", "river", "Einstein", "blue", "Tokyo")]
    results["knn_270m_first_ms"], results["knn_270m_ms"] = knn_ms(v, np.array(queries))
    describe(v, "France", probes=False)
    t0 = time.perf_counter()
    for entity in ("Germany", "Paris", "Mozart"):
        describe(v, entity, probes=False)
    results["describe_features_ms"] = (time.perf_counter() - t0) / 3 * 1e3
    model = larql.load(vindex_path)  # probe edges ask the model the vindex carries
    t0 = time.perf_counter()
    describe(v, "Germany", model=model)
    results["describe_with_probes_ms"] = (time.perf_counter() - t0) * 1e3

    t0 = time.perf_counter()
    big = open_vindex(synthetic_4b(tmp / "synthetic-4b.vindex"))
    results["synthetic_4b_write_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    open_vindex(big.path)
    results["synthetic_4b_open_ms"] = (time.perf_counter() - t0) * 1e3
    q4b = rng.standard_normal((6, big.hidden)).astype(np.float32)
    results["knn_4b_first_ms"], results["knn_4b_ms"] = knn_ms(big, q4b)

    print("\n| measurement | larql | LARQL (published) |\n|---|---:|---:|")
    for key, label in (("extract_browse_s", "extract gemma3-270m, browse (s)"),
                       ("extract_inference_s", "extract gemma3-270m, inference (s)"),
                       ("open_ms", "open gemma3-270m vindex (ms)"),
                       ("knn_270m_ms", "gate KNN per layer, gemma3-270m (ms)"),
                       ("knn_4b_ms", "gate KNN per layer, Gemma-3-4B shapes f16 (ms)"),
                       ("knn_4b_first_ms", "  first query per layer incl. index build (ms)"),
                       ("synthetic_4b_open_ms", "open 4B-shaped vindex (ms)"),
                       ("describe_features_ms", "DESCRIBE, feature edges only (ms)"),
                       ("describe_with_probes_ms", "DESCRIBE with probe edges (ms)")):
        if key in results:
            peer = f"{LARQL_KNN_MS}" if key == "knn_4b_ms" else ""
            print(f"| {label} | {results[key]:.2f} | {peer} |")
    out = save_results("vindex", results)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
