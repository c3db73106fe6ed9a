"""Teacher-forced scoring of targets after prompts, in batches (the edit evaluation's and INSERT's
measurements read it): each prompt runs once, then every target's tokens but its last continue a
copy of the prompt's KV cache, all targets of a group of prompts in one packed pass."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from larql.model.model import Model
from larql.model.prefix import fork
from larql.model.targets import target_ids

F32 = NDArray[np.float32]


# Teacher-forced logit rows per batch: each is a vocabulary of float32 (1 MB on gemma3-270m)
BATCH_ROWS = 64

TokenLogps = list[tuple[float, bool]]  # per target token: (log p, is it the top-1)


class Scorer:
    """Teacher-forced log-probabilities of targets after prompts. `prefetch` scores many (prompt,
    target) pairs in batched passes: the prompts in one pass (each prompt once, whatever number of
    targets follow it), then every target's tokens but its last in a second, each continuing a copy
    of its prompt's KV cache. A pair asked for without a prefetch runs alone."""

    def __init__(self, model: Model) -> None:
        self.m = model
        self._ids: dict[str, list[int]] = {}
        self._prompt_ids: dict[str, list[int]] = {}
        self._scores: dict[tuple[str, str], TokenLogps] = {}

    def target(self, text: str) -> list[int]:
        if text not in self._ids:
            self._ids[text] = target_ids(self.m, text)
        return self._ids[text]

    def prompt(self, prompt: str) -> str:
        """The handle `token_logps` takes for `prompt` (the prompt's ids are tokenized once)."""
        if prompt not in self._prompt_ids:
            self._prompt_ids[prompt] = self.m.tokenize(prompt)
        return prompt

    def prefetch(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Score every (prompt, target) pair not scored yet, a group of prompts at a time, each
        group's passes computing up to about BATCH_ROWS logit rows."""
        by_prompt: dict[str, list[str]] = {}
        for prompt, target in pairs:
            if (prompt, target) not in self._scores and target not in by_prompt.setdefault(prompt, []):
                by_prompt[prompt].append(target)
        group: dict[str, list[str]] = {}
        rows = 0
        for prompt, targets in by_prompt.items():
            n = 1 + sum(len(self.target(t)) - 1 for t in targets)
            if group and rows + n > BATCH_ROWS:
                self._run(group)
                group, rows = {}, 0
            group[prompt] = targets
            rows += n
        if group:
            self._run(group)

    def _run(self, group: dict[str, list[str]]) -> None:
        prompts = list(group)
        caches = [self.m.new_cache(len(self._prompt_ids[self.prompt(p)]) + 8) for p in prompts]
        first = self.m.next_logits_batch([self._prompt_ids[p] for p in prompts], caches)  # (prompts, vocab)
        at = {p: i for i, p in enumerate(prompts)}
        pairs = [(p, t) for p in prompts for t in group[p]]
        rows = {pair: [first[at[pair[0]]]] for pair in pairs}  # the logit rows predicting each target token
        longer = [(p, t) for p, t in pairs if len(self.target(t)) > 1]
        if longer:
            forks = [fork(caches[at[p]], caches[at[p]].length, caches[at[p]].length + len(self.target(t)))
                     for p, t in longer]
            rest = self.m.forward_batch([self.target(t)[:-1] for _, t in longer], caches=forks)
            for pair, logits in zip(longer, rest):  # (len(target) - 1, vocab) each
                rows[pair].extend(logits)
        for pair in pairs:
            logits = np.stack(rows[pair])  # (len(target), vocab)
            want = np.asarray(self.target(pair[1]))
            z = logits.astype(np.float64)
            z -= z.max(axis=1, keepdims=True)
            lse = np.log(np.exp(z).sum(axis=1))  # (len(target),)
            logp = z[np.arange(len(want)), want] - lse
            top = logits.argmax(axis=1) == want
            self._scores[pair] = [(float(a), bool(b)) for a, b in zip(logp, top)]

    def token_logps(self, state: str, target: str) -> TokenLogps:
        """(log p, is top-1) of each token of `target` after the prompt `state` (from `prompt`)."""
        if (state, target) not in self._scores:
            self.prefetch([(state, target)])
        return self._scores[(state, target)]


