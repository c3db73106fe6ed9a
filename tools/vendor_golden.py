"""Copy the parity references the tests read into tests/golden/reference/, trimmed.

The full references (two engines, 30 prompts, activations of 6 prompts) live outside the
repository in ../shared/golden. The tests need only: per prompt the text, ids, top-5 ids and
log-probs and the 24 greedy ids (HF), the ids (llama.cpp), the float32 activations of the first
N_ACTIVATION_PROMPTS prompts and the last-position logits of prompt LOGITS_PROMPT (a full
vocabulary row is 1 MB for Gemma, so one is kept). Activations stay float32: the
parity tests allow a relative error of 1e-4 (1e-6 for the embedding), below float16's 2^-11.

    python tools/vendor_golden.py [SOURCE_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT.parent / "shared" / "golden"
TARGET = ROOT / "tests" / "golden" / "reference"
MODELS = ("gemma3-270m", "smollm2-135m")
N_ACTIVATION_PROMPTS = 2
LOGITS_PROMPT = 1
TOP_K = 5
HF_FIELDS = ("prompt", "ids", "greedy24_ids")
LLAMACPP_FIELDS = ("prompt", "ids")


def _trim_prompts(doc: dict, fields: tuple[str, ...], top: bool) -> dict:
    prompts = []
    for p in doc["prompts"]:
        row = {f: p[f] for f in fields}
        if top:
            row["top5_ids"], row["top5_logprobs"] = p["top20_ids"][:TOP_K], p["top20_logprobs"][:TOP_K]
        prompts.append(row)
    head = {k: v for k, v in doc.items() if k != "prompts"}
    return {**head, "trimmed_from": "../shared/golden (tools/vendor_golden.py)", "prompts": prompts}


def _wanted(name: str) -> bool:
    """'p3.blocks.0.hook_attn_out' -> is prompt 3's array one the tests read?"""
    prompt = int(name.split(".", 1)[0][1:])
    if name.endswith("logits_last"):
        return prompt == LOGITS_PROMPT
    return prompt < N_ACTIVATION_PROMPTS


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n")
    tmp.replace(path)


def vendor(source: Path = SOURCE, target: Path = TARGET) -> int:
    """Write the trimmed references; returns their total size in bytes."""
    target.mkdir(parents=True, exist_ok=True)
    for key in MODELS:
        _write_json(target / f"{key}.hf.json", _trim_prompts(json.loads((source / f"{key}.hf.json").read_text()), HF_FIELDS, True))
        _write_json(target / f"{key}.llamacpp.json",
                    _trim_prompts(json.loads((source / f"{key}.llamacpp.json").read_text()), LLAMACPP_FIELDS, False))
        with np.load(source / f"{key}.hf.npz") as z:
            keep = {n: np.asarray(z[n], np.float32) for n in z.files if _wanted(n)}
        tmp = target / f"{key}.hf.tmp.npz"
        np.savez_compressed(tmp, **keep)
        tmp.replace(target / f"{key}.hf.npz")
    prompts = source / "prompts.json"
    (target / "prompts.json").write_bytes(prompts.read_bytes())
    return sum(f.stat().st_size for f in target.iterdir())


if __name__ == "__main__":
    size = vendor(Path(sys.argv[1]) if len(sys.argv) > 1 else SOURCE)
    print(f"{TARGET.relative_to(ROOT)}: {size / 1e6:.2f} MB")
