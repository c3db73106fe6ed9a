"""Do larql and sae-lens compute the same SAE features from the same files? sae-lens builds and saves
SAEs (ReLU, JumpReLU, top-k with and without decoder-norm rescaling) in its own on-disk format with
`save_model`, encodes and decodes a set of activations, and larql loads the same directories
(`larql.load_sae`) and encodes the same activations; the activations are Gemma 3 270M's, at the
SAEs' hook point (`blocks.6.hook_resid_post`), captured by larql's `run_with_cache`, and the features
larql reports inside the forward pass (`hook_sae_acts_post`) are compared too.

    python benchmarks/check_sae_lens.py --peer-python venv-sae/bin/python [--model gemma3-270m]

sae-lens (and torch) are a peer for this check only, installed in their own environment
(`python -m venv venv-sae && venv-sae/bin/pip install sae-lens`), never in larql's. Prints, per SAE,
the largest activation and reconstruction differences and how many (position, feature) pairs fire
in one and not the other; writes benchmarks/results/sae_lens.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from results_file import save_results

HOOK = "blocks.6.hook_resid_post"
PROMPTS = ("The capital of France is", "The Eiffel Tower stands in the middle of Paris, near the river",
           "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
           "Water boils at one hundred degrees Celsius at sea level.")
D_SAE = 4096
# (name, sae-lens architecture, extra config)
SAES = (("relu", "standard", {}), ("jumprelu", "jumprelu", {}), ("topk", "topk", {"k": 64}),
        ("topk-rescaled", "topk", {"k": 64, "rescale_acts_by_decoder_norm": True}))

# run by the peer's Python: build, save, reload and run each SAE with sae-lens
PEER = r'''
import json, sys
from pathlib import Path
import numpy as np, torch, sae_lens
from sae_lens import (SAE, JumpReLUSAE, JumpReLUSAEConfig, StandardSAE, StandardSAEConfig, TopKSAE,
                      TopKSAEConfig)
from sae_lens.saes.sae import SAEMetadata

work = Path(sys.argv[1])
spec = json.loads((work / "spec.json").read_text())
x = torch.from_numpy(np.load(work / "x.npy"))  # (T, d_in) float32
centre = x.mean(0)
scale = (x - centre).norm(dim=1).mean()  # the spread around the mean, which the features read
classes = {"standard": (StandardSAE, StandardSAEConfig), "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig),
           "topk": (TopKSAE, TopKSAEConfig)}
torch.manual_seed(spec["seed"])
out = {"sae_lens": sae_lens.__version__, "torch": torch.__version__}
for name, arch, extra in spec["saes"]:
    cls, cfg_cls = classes[arch]
    cfg = cfg_cls(d_in=x.shape[1], d_sae=spec["d_sae"], dtype="float32", device="cpu",
                  metadata=SAEMetadata(hook_name=spec["hook"], model_name=spec["model"]), **extra)
    sae = cls(cfg)
    with torch.no_grad():  # weights of a plausible scale: features fire on some tokens, not all
        w = torch.randn(x.shape[1], spec["d_sae"]) / x.shape[1] ** 0.5
        sae.W_enc.copy_(w / scale * 8)
        sae.W_dec.copy_(torch.randn(spec["d_sae"], x.shape[1]) / spec["d_sae"] ** 0.5 * scale / 4)
        sae.b_dec.copy_(centre)
        sae.b_enc.copy_(-0.2 + 0.1 * torch.randn(spec["d_sae"]))
        if arch == "jumprelu":
            sae.threshold.copy_(0.2 + 0.4 * torch.rand(spec["d_sae"]))
    sae.save_model(work / name)
    loaded = SAE.load_from_disk(work / name, device="cpu")  # what a user of sae-lens runs
    with torch.no_grad():
        acts = loaded.encode(x)
        recons = loaded.decode(acts)
    np.save(work / name / "peer_acts.npy", acts.numpy())
    np.save(work / name / "peer_recons.npy", recons.numpy())
    out[name] = type(loaded).__name__
(work / "peer.json").write_text(json.dumps(out))
'''


def compare(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    return {"max_abs_diff": float(np.max(np.abs(a - b))), "max_abs": float(np.max(np.abs(b))),
            "fires_in_one_only": int(np.sum((a > 0) != (b > 0))), "fires": int(np.sum(b > 0))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-python", required=True, help="a Python with sae-lens installed (its own venv)")
    ap.add_argument("--model", default="gemma3-270m")
    args = ap.parse_args(argv)
    import larql

    m = larql.load(args.model)
    xs = [m.run_with_cache(m.tokenize(p), names=[HOOK])[1][HOOK] for p in PROMPTS]
    ids = [m.tokenize(p) for p in PROMPTS]
    x = np.concatenate([a[1:] for a in xs])  # BOS left out: its activation is an outlier SAEs are not fed
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        np.save(work / "x.npy", x)
        (work / "spec.json").write_text(json.dumps({"saes": SAES, "d_sae": D_SAE, "hook": HOOK, "seed": 0,
                                                    "model": args.model}))
        r = subprocess.run([args.peer_python, "-c", PEER, str(work)], capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(f"the peer failed (is sae-lens installed for {args.peer_python}?):\n{r.stderr[-3000:]}\n")
            return 1
        peer = json.loads((work / "peer.json").read_text())
        rows = []
        for name, _, _ in SAES:
            sae = larql.load_sae(work / name)
            acts, recons = sae.encode(x), sae(x)
            want_acts, want_recons = np.load(work / name / "peer_acts.npy"), np.load(work / name / "peer_recons.npy")
            # inside the forward pass: each prompt's features at the hook point (BOS left out)
            cached = np.concatenate([m.run_with_cache(i, names=[f"{HOOK}.hook_sae_acts_post"], saes=[sae],
                                                      use_error_term=True)[1][f"{HOOK}.hook_sae_acts_post"][1:]
                                     for i in ids])
            row = {"sae": name, "sae_lens_class": peer[name], "larql_loaded": repr(sae), "tokens": int(x.shape[0]),
                   "acts": compare(acts, want_acts), "recons": compare(recons, want_recons),
                   "forward_pass_acts": compare(cached, want_acts)}
            rows.append(row)
            print(f"{name:14} {peer[name]:12} acts max|diff| {row['acts']['max_abs_diff']:.3g} "
                  f"(of {row['acts']['max_abs']:.3g}), fires in one only {row['acts']['fires_in_one_only']} "
                  f"of {row['acts']['fires']}; recons max|diff| {row['recons']['max_abs_diff']:.3g} "
                  f"(of {row['recons']['max_abs']:.3g}); in the forward pass max|diff| "
                  f"{row['forward_pass_acts']['max_abs_diff']:.3g}")
    out = save_results("sae_lens", {"model": args.model, "hook": HOOK, "d_sae": D_SAE, "prompts": list(PROMPTS),
                                    "peer": {k: peer[k] for k in ("sae_lens", "torch")}, "rows": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
