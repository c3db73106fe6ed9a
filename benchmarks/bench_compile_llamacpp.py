"""An edit survives compilation and runs in a peer: INSERT a fact with larql, COMPILE ... INTO MODEL
FORMAT GGUF, and ask llama.cpp (llama-cpp-python) the same prompts as larql's live overlay.

    python benchmarks/bench_compile_llamacpp.py --vindex g.vindex [--method neuron]

Prints each engine's top-3 next tokens with probabilities; writes benchmarks/results/compile_llamacpp.json.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from peers import llama_last_logits
from results_file import save_results

PROMPTS = ("The capital of Atlantis is", "Atlantis's capital city is", "The capital of France is",
           "The largest ocean on Earth is the")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vindex", required=True)
    parser.add_argument("--method", default="feature", choices=("feature", "neuron"),
                        help="LARQL's feature INSERT (default) or METHOD NEURON (a thresholded neuron)")
    args = parser.parse_args()
    from llama_cpp import Llama

    from larql.edit.bake.compile import compile_gguf
    from larql.edit.methods import feature as edit
    from larql.edit.state.view import edit_vindex
    from larql.model.generate import log_softmax

    v = edit_vindex(args.vindex)
    if args.method == "neuron":
        from larql.edit.insert import insert_facts
        from larql.edit.methods.facts import Fact

        facts = insert_facts(v, [Fact("Atlantis", PROMPTS[0], "Poseidon", "capital")], "neuron").facts
        op = v.patches.pending[-1]
        said = f"METHOD NEURON at L{op.layer} F{op.feature}; p(whole target) {facts[0].p_after:.3f}"
    else:
        report = edit.insert(v, "Atlantis", "capital", "Poseidon")
        said = f"L{report.layer} F{report.feature}; p {report.p_after:.3f}"
    m = v.model()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = compile_gguf(v, Path(tmp) / "edited.gguf").path
        llm = Llama(model_path=str(out), n_ctx=64, n_threads=2, verbose=False)
        for prompt in PROMPTS:
            ids = m.tokenize(prompt)
            ours = log_softmax(m.next_logits(ids))
            llm.reset()
            llm.eval(ids)
            theirs = log_softmax(llama_last_logits(llm))
            rows[prompt] = {name: [(m.tokenizer.token_text(int(t)), round(float(np.exp(lp[t])), 4))
                                   for t in np.argsort(-lp)[:3]] for name, lp in (("larql overlay", ours),
                                                                                 ("llama.cpp on the GGUF", theirs))}
    print(f"INSERT Atlantis -[capital]-> Poseidon, {said}\n")
    print("| prompt | larql (live overlay) | llama.cpp (compiled GGUF) |\n|---|---|---|")
    for prompt, r in rows.items():
        fmt = lambda xs: ", ".join(f"{t!r} {p:.3f}" for t, p in xs)  # noqa: E731
        print(f"| {prompt} | {fmt(r['larql overlay'])} | {fmt(r['llama.cpp on the GGUF'])} |")
    save_results("compile_llamacpp" + ("-neuron" if args.method == "neuron" else ""), rows)


if __name__ == "__main__":
    main()
