"""Load the bundled Gemma 3 270M, look at its next-token distribution, read a layer, generate.

    python examples/run_model.py
"""

from __future__ import annotations

import numpy as np

import larql
from larql import interp

m = larql.load("gemma3-270m")
prompt = "The capital of France is"
ids = m.tokenize(prompt)
print(m, "\nprompt ids:", ids)

# next-token distribution
logits = m.next_logits(ids)
logp = interp.log_softmax(logits)
for tok in interp.top_tokens(logits, 5):
    print(f"  {m.tokenizer.token_text(int(tok))!r:12} p={np.exp(logp[tok]):.3f}")

# capture the residual stream after layer 8 through a hook point
captured = {}
m.forward(ids, hooks={"blocks.8.hook_resid_post": lambda x, name: captured.setdefault(name, x.copy())})
resid = captured["blocks.8.hook_resid_post"]
print("blocks.8.hook_resid_post:", resid.shape, f"norm of last position {np.linalg.norm(resid[-1]):.1f}")

# greedy continuation
out = m.generate(prompt, max_new_tokens=12)
print(prompt + out.text)
