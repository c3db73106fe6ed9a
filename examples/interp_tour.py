"""Capture, logit lens, activation patching, steering and TRACE on the bundled Gemma 3 270M.

    python examples/interp_tour.py
"""

from __future__ import annotations

import larql
from larql import hooks, interp

m = larql.load("gemma3-270m")
prompt = "The capital of France is"
ids = m.tokenize(prompt)
paris = m.tokenize(" Paris")[1]  # drop BOS

# 1. capture: every hook point, [seq, ...] arrays
logits, cache = m.run_with_cache(ids)
print("captured", len(cache), "hook points; blocks.9.attn.hook_pattern", cache["blocks.9.attn.hook_pattern"].shape)

# 2. logit lens: where does ' Paris' become likely?
for layer, (rank, prob) in enumerate(interp.token_trajectory(m, ids, paris)):
    if layer % 3 == 2:
        print(f"  after layer {layer:2d}: ' Paris' rank {rank:6d}  p={prob:.3f}")

# 3. activation patching: Germany's residual into France's prompt at the entity position
donor = m.tokenize("The capital of Germany is")
berlin = m.tokenize(" Berlin")[1]
before = interp.log_softmax(logits[-1])
after = interp.log_softmax(interp.patch_activation(m, donor, ids, layer=6, position=4)[-1])
print(f"patching Germany in at layer 6: log p(' Paris') {before[paris]:.2f} -> {after[paris]:.2f}, "
      f"log p(' Berlin') {before[berlin]:.2f} -> {after[berlin]:.2f}")

# 4. steering: a 'French' direction from contrastive prompts, added while generating
v = interp.steering_vector(m, ["Je suis", "Bonjour, je"], ["I am", "Hello, I"], layer=6)
out = m.generate("My favourite food is", max_new_tokens=8, hooks={"blocks.6.hook_resid_post": hooks.Add(1.5 * v)})
print("steered:", repr(out.text))

# 5. TRACE through LQL with the model in use
trace = larql.execute(f'TRACE "{prompt}" FOR "Paris" LAYERS 10-17', larql.Session(model=m))[0]
print(trace.title)
for row in trace.rows:
    print("  ", row)
