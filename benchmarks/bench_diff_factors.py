"""DIFF ... INTO PATCH of a ROME edit: the weight delta stored as rank-r factors against the same
patch written per feature, and whether either, applied to the base, gives the edited copy's logits.

    python benchmarks/bench_diff_factors.py --vindex g.vindex

The vindex is copied (with its key statistics, `g.vindex.stats`, when present) into a scratch
directory, so the one named is only read. Writes benchmarks/results/diff_factors.json.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from results_file import save_results

PROMPTS = ("The capital of France is", "The Eiffel Tower is in", "Bees make", "The capital of Japan is")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vindex", required=True)
    args = parser.parse_args()
    import larql
    from larql.cli.benchmark import machine
    from larql.edit.maintain import diff as diff_mod
    from larql.lql.executor import execute
    from larql.lql.session import Session

    src = Path(args.vindex)
    out: dict[str, object] = {"machine": machine(), "vindex": str(src)}
    with tempfile.TemporaryDirectory(dir=src.parent.parent) as tmp:
        base = Path(tmp) / src.name
        shutil.copytree(src, base)
        if Path(f"{src}.stats").is_dir():
            shutil.copytree(f"{src}.stats", f"{base}.stats")
        s = Session()
        execute(f'USE "{base}"', s)
        t0 = time.perf_counter()
        execute('INSERT INTO EDGES (entity, relation, target) VALUES ("France", "capital", "Rome")', s)
        out["insert_s"] = time.perf_counter() - t0
        edited = Path(tmp) / "rome.vindex"
        execute(f'COMPILE CURRENT INTO VINDEX "{edited}"', s)
        want = larql.load(edited).dense()
        base_model = larql.load(base).dense()
        for name, max_rank in (("factors", diff_mod.MAX_FACTOR_RANK), ("per_feature", 0)):
            diff_mod.MAX_FACTOR_RANK = max_rank  # 0: the per-feature form DIFF wrote before factors
            patch = Path(tmp) / f"{name}.vlp"
            t0 = time.perf_counter()
            (res,) = execute(f'DIFF "{base}" "{edited}" INTO PATCH "{patch}"')
            seconds = time.perf_counter() - t0
            s2 = Session()
            execute(f'USE "{base}"; APPLY PATCH "{patch}"', s2)
            m = s2.vindex.model()  # type: ignore[union-attr]
            worst, moved = 0.0, 0.0
            for prompt in PROMPTS:
                ids = m.tokenize(prompt)
                w = want.next_logits(ids)
                worst = max(worst, float(np.max(np.abs(m.next_logits(ids) - w))))
                moved = max(moved, float(np.max(np.abs(base_model.next_logits(ids) - w))))
            out[name] = {"bytes": patch.stat().st_size, "diff_s": seconds, "rows": len(res.rows),
                         "first_row": res.rows[0], "max_abs_logit_error": worst, "edit_moved_logits_by": moved}
            print(f"{name}: {patch.stat().st_size:,} bytes, {len(res.rows)} row(s) ({res.rows[0]}), DIFF {seconds:.1f} s, "
                  f"max |logit - edited copy's| {worst:.2e} (the edit moved them by up to {moved:.2f})")
    save_results("diff_factors", out)


if __name__ == "__main__":
    main()
