"""Does an exported HF directory give larql's answer in transformers? Export each model with larql
(COMPILE ... INTO MODEL FORMAT SAFETENSORS writes the same files), load it with
`AutoModelForCausalLM.from_pretrained` + `AutoTokenizer`, and compare next-token logits.

    python benchmarks/check_safetensors_export.py [--models gemma3-270m,smollm2-135m] [--dtype bf16]
    python benchmarks/check_safetensors_export.py --vindex g.vindex [--patch facts.vlp]
    python benchmarks/check_safetensors_export.py --dirs tests/golden/architectures/gemma2,tests/golden/architectures/mixtral --dtype f32

transformers and torch are peers for this check only (not larql dependencies, not in CI). Prints,
per prompt, larql's top-5 on the source beside transformers' top-5 on the export (computed in
float32, and in the export's own dtype) and the largest logit difference; writes
benchmarks/results/safetensors_export_DTYPE.json.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from results_file import save_results

PROMPTS = ("The capital of France is", "The largest ocean on Earth is the", "def fibonacci(n):")


def _top(logits: np.ndarray, decode: Any, k: int = 5) -> list[str]:
    return [decode(int(i)) for i in np.argsort(-logits)[:k]]


def check(name: str, source: Any, export_dir: Path, dtype: str) -> list[dict[str, Any]]:
    """larql on `source` (a Model) against transformers on `export_dir`, prompt by prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import larql

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(export_dir)
    engines = {"f32": AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32)}
    if dtype != "f32":  # the dtype a user gets with dtype="auto"
        engines[dtype] = AutoModelForCausalLM.from_pretrained(export_dir, dtype="auto")
    reloaded = larql.load(export_dir)
    rows = []
    for prompt in PROMPTS:
        ids = source.tokenize(prompt)
        hf_ids = tok(prompt).input_ids
        want = source.next_logits(ids)
        row: dict[str, Any] = {"model": name, "prompt": prompt, "same_token_ids": hf_ids == ids,
                               "larql": _top(want, source.tokenizer.token_text)}
        back = reloaded.next_logits(reloaded.tokenize(prompt))
        row["larql_on_export"] = {"top5": _top(back, source.tokenizer.token_text),
                                  "max_abs_diff": float(np.max(np.abs(back - want)))}
        for label, hf in engines.items():
            with torch.no_grad():
                got = hf(torch.tensor([hf_ids])).logits[0, -1].float().numpy()
            row[f"transformers_{label}"] = {"top5": _top(got, lambda i: tok.decode([i])),
                                            "max_abs_diff": float(np.max(np.abs(got - want)))}
        rows.append(row)
        print(f"\n{name}  {prompt!r}  (token ids identical: {row['same_token_ids']})")
        print(f"  {'larql (source)':<22} {row['larql']}")
        for key in [k for k in row if k.startswith(("larql_on", "transformers"))]:
            print(f"  {key:<22} {row[key]['top5']}  max |dlogit| {row[key]['max_abs_diff']:.4f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gemma3-270m,smollm2-135m")
    parser.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16")
    parser.add_argument("--vindex", help="compile this vindex (its patches applied) instead of the models")
    parser.add_argument("--patch", action="append", default=[])
    parser.add_argument("--dirs", help="export these model paths (HF directories or GGUF files, comma-separated), "
                                       "e.g. the tiny references of tests/golden/architectures, instead of the models")
    args = parser.parse_args()

    import larql
    from larql.edit.bake.compile import compile_safetensors
    from larql.model.export_hf import export_model

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.vindex:
            v = larql.edit_vindex(args.vindex)
            for p in args.patch:
                v.patches.apply(p)
            out = compile_safetensors(v, Path(tmp) / "export", dtype=args.dtype).path
            rows += check(Path(args.vindex).name, v.model(), out, args.dtype)
        elif args.dirs:
            for path in args.dirs.split(","):
                model = larql.load(path)
                out = export_model(model, Path(tmp) / Path(path).name, dtype=args.dtype)
                rows += check(Path(path).name, model, out, args.dtype)
        else:
            for alias in args.models.split(","):
                model = larql.load(alias)
                out = export_model(model, Path(tmp) / alias, dtype=args.dtype)
                rows += check(alias, model, out, args.dtype)
    label = f"safetensors_export_tiny_{args.dtype}" if args.dirs else f"safetensors_export_{args.dtype}"
    print(f"\nwrote {save_results(label, {'dtype': args.dtype, 'rows': rows})}")


if __name__ == "__main__":
    main()
