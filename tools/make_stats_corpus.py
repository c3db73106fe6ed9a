"""Write larql/edit/methods/data/stats_corpus_generated.txt: English text gemma3-270m writes itself.

    python tools/make_stats_corpus.py [--model gemma3-270m] [--tokens 20000] [--seed 1]

The key statistics of weight edits (larql/edit/methods/stats.py) should look like the prompts edits are
asked about: short, everyday English. CPython's reference prose, the earlier default, is mostly
about Python, and on gemma3-270m short English prompts' keys sat 1.4-2.7x further out in its C^-1
norm than the corpus's own. This samples continuations (temperature 1, top-40, seeded) of 40
generic openings, about 128 tokens each, until `--tokens` tokens: nothing downloaded, and the text
ships with larql so that no user waits the ~20 minutes it takes on two busy cores. Sampling runs
through larql's numba kernels, so another machine may diverge after a few tokens; the shipped file
is the corpus, this script is how it was made.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "larql" / "edit" / "methods" / "data" / "stats_corpus_generated.txt"
OPENINGS = ("The", "In", "She", "He", "It was", "Many", "The city of", "The history of", "After the war,",
            "According to", "My favourite", "Scientists", "The company", "When I was", "The river", "In 1987,",
            "The president", "Music", "Football", "The book", "Yesterday", "The capital", "People in",
            "The island of", "During the", "His father", "The language", "Most", "A new", "The first", "Born in",
            "The museum", "Although", "The film", "The team", "Today", "The university", "Farmers", "The king",
            "The recipe")


def main() -> None:
    import larql
    from larql.edit.methods.stats import GENERATED_SEPARATOR

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    model = larql.load(args.model)
    rng = np.random.default_rng(args.seed)
    texts: list[str] = []
    total, t0 = 0, time.perf_counter()
    while total < args.tokens:
        start = OPENINGS[len(texts) % len(OPENINGS)]
        gen = model.generate(start, max_new_tokens=127, temperature=1.0, top_k=40,
                             seed=int(rng.integers(1 << 31)), stop_at_eos=True)
        texts.append(start + gen.text)
        total += len(gen.ids) + 1
        print(f"{len(texts)} samples, {total} tokens, {total / (time.perf_counter() - t0):.1f} tok/s", flush=True)
    tmp = Path(args.out + ".tmp")
    tmp.write_text(GENERATED_SEPARATOR.join(texts), encoding="utf-8")
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
