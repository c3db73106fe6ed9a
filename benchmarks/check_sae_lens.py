"""Do larql and sae-lens compute the same SAE features from the same files? sae-lens builds and saves
SAEs (ReLU, JumpReLU, top-k with and without decoder-norm rescaling) in its own on-disk format with
`save_model`, encodes and decodes a set of activations, and larql loads the same directories
(`larql.load_sae`) and encodes the same activations; the activations are Gemma 3 270M's, at the
SAEs' hook point (`blocks.6.hook_resid_post`), captured by larql's `run_with_cache`, and the features
larql reports inside the forward pass (`hook_sae_acts_post`) are compared too. Transcoders likewise
(Transcoder, SkipTranscoder, JumpReLUTranscoder, JumpReLUSkipTranscoder at layer 6's MLP, named as
Gemma Scope 2 names them): sae-lens encodes the MLP's normed input and computes its output
(`forward`, W_skip included), larql the same from the same files, alone and in place of the MLP.

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
TC_IN, TC_OUT = "blocks.6.hook_mlp_in", "blocks.6.hook_mlp_out"  # Gemma Scope 2's names for layer 6's MLP
TRANSCODERS = ("transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder")
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
xt = torch.from_numpy(np.load(work / "xt.npy"))  # (T, d_in) the MLP's normed input
tscale = xt.norm(dim=1).mean()
tclasses = {"transcoder": (sae_lens.Transcoder, sae_lens.TranscoderConfig),
            "skip_transcoder": (sae_lens.SkipTranscoder, sae_lens.SkipTranscoderConfig),
            "jumprelu_transcoder": (sae_lens.JumpReLUTranscoder, sae_lens.JumpReLUTranscoderConfig),
            "jumprelu_skip_transcoder": (sae_lens.JumpReLUSkipTranscoder, sae_lens.JumpReLUSkipTranscoderConfig)}
d = xt.shape[1]
for name in spec["transcoders"]:
    cls, cfg_cls = tclasses[name]
    cfg = cfg_cls(d_in=d, d_sae=spec["d_sae"], d_out=d, dtype="float32", device="cpu", apply_b_dec_to_input=False,
                  metadata=SAEMetadata(hook_name=spec["tc_in"], hook_name_out=spec["tc_out"], model_name=spec["model"]))
    tc = cls(cfg)
    with torch.no_grad():
        tc.W_enc.copy_(torch.randn(d, spec["d_sae"]) / d ** 0.5 / tscale * 8)
        tc.W_dec.copy_(torch.randn(spec["d_sae"], d) / spec["d_sae"] ** 0.5)
        tc.b_enc.copy_(-0.2 + 0.1 * torch.randn(spec["d_sae"]))
        tc.b_dec.copy_(0.1 * torch.randn(d))
        if "jumprelu" in name:
            tc.threshold.copy_(0.2 + 0.4 * torch.rand(spec["d_sae"]))
        if "skip" in name:
            tc.W_skip.copy_(0.05 * torch.randn(d, d) / d ** 0.5)
    tc.save_model(work / name)
    loaded = SAE.load_from_disk(work / name, device="cpu")
    with torch.no_grad():
        acts = loaded.encode(xt)
        recons = loaded(xt)  # the transcoder's output, W_skip included
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
    from larql.model.forward import norm

    layer, mid = 6, "blocks.6.hook_resid_mid"
    lw = m.weights.layers[layer]
    xt = np.concatenate([norm(m.config, m.run_with_cache(i, names=[mid])[1][mid], lw.ffn_norm, lw.ffn_norm_bias)[1:]
                         for i in ids])  # (T, hidden) the MLP's normed input, BOS left out
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        np.save(work / "x.npy", x)
        np.save(work / "xt.npy", xt)
        (work / "spec.json").write_text(json.dumps({"saes": SAES, "d_sae": D_SAE, "hook": HOOK, "seed": 0,
                                                    "model": args.model, "transcoders": TRANSCODERS,
                                                    "tc_in": TC_IN, "tc_out": TC_OUT}))
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
        tc_rows = []
        for name in TRANSCODERS:
            tc = larql.load_sae(work / name)
            acts, recons = tc.encode(xt), tc(xt)
            want_acts, want_recons = np.load(work / name / "peer_acts.npy"), np.load(work / name / "peer_recons.npy")
            points = [f"{TC_IN}.hook_sae_acts_post", f"{TC_IN}.hook_sae_recons"]
            caches = [m.run_with_cache(i, names=points, saes=[tc], use_error_term=True)[1] for i in ids]
            cached_acts = np.concatenate([c[points[0]][1:] for c in caches])
            cached_recons = np.concatenate([c[points[1]][1:] for c in caches])
            row = {"transcoder": name, "sae_lens_class": peer[name], "larql_loaded": repr(tc), "tokens": int(xt.shape[0]),
                   "acts": compare(acts, want_acts), "output": compare(recons, want_recons),
                   "forward_pass_acts": compare(cached_acts, want_acts),
                   "forward_pass_output": compare(cached_recons, want_recons)}
            tc_rows.append(row)
            print(f"{name:25} {peer[name]:22} acts max|diff| {row['acts']['max_abs_diff']:.3g} "
                  f"(of {row['acts']['max_abs']:.3g}), fires in one only {row['acts']['fires_in_one_only']} "
                  f"of {row['acts']['fires']}; output max|diff| {row['output']['max_abs_diff']:.3g} "
                  f"(of {row['output']['max_abs']:.3g}); in the forward pass acts "
                  f"{row['forward_pass_acts']['max_abs_diff']:.3g}, output {row['forward_pass_output']['max_abs_diff']:.3g}")
    out = save_results("sae_lens", {"model": args.model, "hook": HOOK, "d_sae": D_SAE, "prompts": list(PROMPTS),
                                    "peer": {k: peer[k] for k in ("sae_lens", "torch")}, "rows": rows,
                                    "transcoder_hooks": [TC_IN, TC_OUT], "transcoders": tc_rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
