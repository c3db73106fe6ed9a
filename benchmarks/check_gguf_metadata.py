"""The GGUF metadata COMPILE ... FORMAT GGUF rebuilds from a vindex (when its source GGUF is gone)
against the source GGUF's own: every key, the token types, and the tokenizer larql builds from each
on a text (this README) — the same ids, or the first difference.

    python benchmarks/check_gguf_metadata.py --vindex g.vindex

Writes benchmarks/results/gguf_metadata-MODEL.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from results_file import save_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vindex", required=True)
    args = parser.parse_args()
    from larql.cli.benchmark import machine
    from larql.model.config import config_from_gguf
    from larql.model.gguf_file import GGUFFile
    from larql.model.gguf_meta import vindex_fields
    from larql.model.tokenizer import tokenizer_from_gguf

    v = Path(args.vindex)
    index = json.loads((v / "index.json").read_text())
    t0 = time.perf_counter()
    ours = vindex_fields(index, (v / "tokenizer.json").read_text())
    seconds = time.perf_counter() - t0
    theirs = GGUFFile(index["source"]["path"]).metadata
    missing = sorted(k for k in theirs if k not in ours)
    extra = sorted(k for k in ours if k not in theirs)
    differ = sorted(k for k in ours if k in theirs and not np.array_equal(np.asarray(ours[k]), np.asarray(theirs[k]))
                    and not (isinstance(ours[k], float) and abs(ours[k] - theirs[k]) <= 1e-6 * abs(theirs[k])))
    types_a = np.asarray(theirs.get("tokenizer.ggml.token_type"))
    types_b = np.asarray(ours["tokenizer.ggml.token_type"])
    bad_types = {f"{int(a)} -> {int(b)}": int(n) for (a, b), n in
                 zip(*np.unique(np.stack([types_a, types_b])[:, types_a != types_b].T, axis=0, return_counts=True))}
    cfg_same = config_from_gguf({**ours, "general.architecture": index["model_config"]["arch"]}, "rebuilt", True) \
        == config_from_gguf(theirs, "source", True)
    tok_a = tokenizer_from_gguf(theirs, "source")
    tok_b = tokenizer_from_gguf({**theirs, **ours}, "rebuilt")
    lines = [line for line in (Path(__file__).parents[1] / "README.md").read_text().splitlines() if line.strip()]
    first_diff = next((line for line in lines if tok_a.encode(line) != tok_b.encode(line)), None)
    n_tokens = sum(len(tok_a.encode(line)) for line in lines)
    out = {"machine": machine(), "vindex": str(v), "seconds": seconds, "keys_missing": missing, "keys_extra": extra,
           "keys_differing": differ, "token_types_changed": bad_types, "config_same": cfg_same,
           "lines": len(lines), "tokens": n_tokens, "first_line_tokenized_differently": first_diff,
           "compiled_max_abs_logit_diff": _compiled_logits(v)}
    print(json.dumps({k: w for k, w in out.items() if k != "machine"}, indent=1))
    save_results(f"gguf_metadata-{index['model']}", out)


def _compiled_logits(v: Path) -> float:
    """COMPILE the vindex to a GGUF as if its source were gone, load that file, and compare its logits
    with the vindex's on three prompts (the largest difference)."""
    import tempfile

    import larql
    from larql.edit.bake.compile import compile_gguf
    from larql.edit.state.view import edit_vindex

    ev = edit_vindex(v)
    ev.index["source"]["path"] = "/nonexistent/source.gguf"  # in memory only: the file on disk is unchanged
    live = ev.model()
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        out = compile_gguf(ev, Path(tmp) / "rebuilt.gguf").path
        m = larql.load(out)
        for prompt in ("The capital of France is", "Bees make", "def fibonacci(n):"):
            ids = live.tokenize(prompt)
            assert m.tokenize(prompt) == ids
            worst = max(worst, float(np.max(np.abs(m.next_logits(ids) - live.next_logits(ids)))))
    return worst


if __name__ == "__main__":
    main()
