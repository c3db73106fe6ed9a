"""Add transformers' attention patterns to the tiny references of tests/golden/architectures (a dev tool).

For each architecture directory there (built by tools/make_tiny_references.py): load it with
transformers (float32, eager attention), run each prompt of its `<arch>.npz` with
`output_attentions=True`, and write `<arch>.attn.npz` holding `p<i>.attentions`, shape
(layers, heads, seq, seq): the softmax each head computed, what larql's
`interp.attention_patterns` must reproduce (tests/parity/test_attention_patterns.py). Only the
short prompt (p1) is kept, to keep the files small.

Needs torch and transformers, neither a runtime or CI dependency of larql. From the repository root:
    python tools/make_attention_references.py            # every architecture
    python tools/make_attention_references.py gemma2     # one
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
REFS = ROOT / "tests" / "golden" / "architectures"
PROMPTS = ("p1",)


def build(arch: str) -> Path:
    model = transformers.AutoModelForCausalLM.from_pretrained(REFS / arch, attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    ref = np.load(REFS / f"{arch}.npz")
    out = {}
    for p in PROMPTS:
        ids = torch.tensor(ref[f"{p}.ids"], dtype=torch.long)[None]
        with torch.no_grad():
            got = model(ids, output_attentions=True)
        out[f"{p}.ids"] = ref[f"{p}.ids"]
        out[f"{p}.attentions"] = np.stack([a[0].numpy().astype(np.float32) for a in got.attentions])
    path = REFS / f"{arch}.attn.npz"
    np.savez_compressed(path, **out)
    return path


def main(names: list[str]) -> None:
    for arch in names or sorted(p.name for p in REFS.iterdir() if p.is_dir()):
        path = build(arch)
        print(f"{path.relative_to(ROOT)}: {np.load(path)['p1.attentions'].shape}")


if __name__ == "__main__":
    main(sys.argv[1:])
