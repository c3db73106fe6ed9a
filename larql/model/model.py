"""Model: config + memory-mapped weights + tokenizer, with tokenize / forward / generate."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import ContextLengthError, ModelError
from larql.model.attention import KVCache
from larql.model.config import ModelConfig
from larql.model.ffn import FFN, FFNEdits
from larql.model.forward import Forward
from larql.model.generate import Generation, SamplingParams, sample
from larql.model.hooks import (
    HookSpec,
    all_hook_names,
    capture_into,
    compile_spec,
    hook_name,
    intervention_fn,
)
from larql.model.prefix import PrefixCache
from larql.model.sae import SAE, SAE_POINTS, attach_saes, check_saes, feature_hook_names
from larql.model.tokenizer import TextTokenizer
from larql.model.transcoder import Transcoder, attach_transcoders, check_transcoders
from larql.model.weights import Weights

if TYPE_CHECKING:
    from larql.model.crown import CrownReport


class Model:
    """A loaded model. Build one with `larql.load(src)`."""

    def __init__(self, name: str, source: Path, cfg: ModelConfig, weights: Weights, tokenizer: TextTokenizer,
                 edits: FFNEdits | None = None) -> None:
        self.name, self.source, self.config = name, source, cfg
        self.weights, self.tokenizer = weights, tokenizer
        # edits: an FFN edit strategy (e.g. a vindex's patch overlay, see model/ffn.py); None is dense
        self._forward = Forward(cfg, weights, edits)
        self._wraps: tuple[Callable[[FFN], FFN], ...] = ()  # with_ffn's wrappers, innermost first
        self.prefixes = PrefixCache()  # KV caches of earlier prompts, reused for shared prefixes (prefix.py)

    @property
    def edits(self) -> FFNEdits | None:
        """The FFN edit strategy this model runs with (None: the dense FFN)."""
        return self._forward.ffn.edits

    def revision(self) -> Hashable | None:
        """A value that changes whenever what this model computes may have: () for the dense FFN,
        the edit strategy's `revision` (an edit bumps it); None when that cannot be told (a strategy
        without one, an FFN block replaced by `with_ffn`), so nothing computed earlier is reused."""
        if type(self._forward.ffn) is not FFN:
            return None
        edits = self.edits
        return () if edits is None else getattr(edits, "revision", None)

    def with_edits(self, edits: FFNEdits | None) -> Model:
        """This model (same weights, tokenizer) with another FFN edit strategy; an FFN computed
        elsewhere (`with_ffn`) stays elsewhere, with the new edits."""
        m = Model(self.name, self.source, self.config, self.weights, self.tokenizer, edits)
        for wrap in self._wraps:
            m._forward.ffn = wrap(m._forward.ffn)
        m._wraps = self._wraps
        return m

    def ffn_block(self, layer: int, h: NDArray[np.float32]) -> NDArray[np.float32]:
        """Layer `layer`'s FFN output `(T, hidden)` for its normed input h `(T, hidden)`, no hooks."""
        return self._forward.ffn(layer, np.ascontiguousarray(h, dtype=np.float32), None, 0)

    def with_ffn(self, wrap: Callable[[FFN], FFN]) -> Model:
        """This model (same weights, tokenizer, edits) with its FFN block replaced by `wrap(ffn)`: a
        seam for an FFN computed elsewhere (larql/serve/ffn_remote.py serves a layer range over HTTP)."""
        m = self.with_edits(self.edits)
        m._forward.ffn = wrap(m._forward.ffn)  # this model's FFN, so that wrappers compose (several shards)
        m._wraps = (*self._wraps, wrap)  # with_edits wraps the new FFN again (a server session's edits)
        return m

    def expert_outputs(self, layer: int, experts: list[int], xs: list[NDArray[np.float32]]) -> list[NDArray[np.float32]]:
        """A mixture-of-experts layer's experts, each on its rows `(t_e, hidden)` (normed FFN input),
        before the router's weighting (FFN.expert_outputs), no hooks: what an expert shard serves."""
        return self._forward.ffn.expert_outputs(layer, experts, [np.ascontiguousarray(x, dtype=np.float32) for x in xs])

    def crown(self, prompt: str, expected: str, subject: str | None = None,
              layers: list[int] | None = None) -> CrownReport:
        """Which layer's MLP carries a fact: each layer's MLP output zeroed at the last position (and
        at the subject's last token when `subject` is given), and what that does to `expected`.

        Example:
            >>> m.crown("The capital of France is", "Paris", "France").crown("subject").layer
        """
        from larql.model.crown import find_crown

        return find_crown(self, prompt, expected, subject, layers)

    def dense(self) -> Model:
        """This model with the plain dense FFN (same weights, no vindex walk, no patch overlay)."""
        return self if self.edits is None else self.with_edits(None)

    def __repr__(self) -> str:
        c = self.config
        return f"Model({self.name!r}, arch={c.arch}, layers={c.n_layers}, hidden={c.hidden}, vocab={c.vocab})"

    @property
    def vocab_size(self) -> int:
        return self.weights.output.n_rows

    def hook_names(self) -> list[str]:
        """The hook points a forward pass of this model reaches, in order: not `hook_rot_q/k` without
        RoPE (GPT-2), the routing points only in a mixture of experts, which has no `mlp.hook_pre/post`."""
        c = self.config
        unreached: tuple[str, ...] = ("attn.hook_rot_q", "attn.hook_rot_k") if c.positions != "rope" else ()
        unreached += (("mlp.hook_pre", "mlp.hook_post") if c.n_experts
                      else ("mlp.hook_router", "mlp.hook_expert_weights", "mlp.hook_expert_indices"))
        return all_hook_names(c.n_layers, unreached, c.n_experts)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text`, with BOS when the model's tokenizer adds one."""
        return self.tokenizer.encode(text)

    def detokenize(self, ids: list[int] | NDArray[np.int64]) -> str:
        return self.tokenizer.decode(ids)

    def new_cache(self, capacity: int = 256) -> KVCache:
        c = self.config
        return KVCache(c.n_layers, c.n_kv_heads, c.head_dim, capacity)

    def _check_ids(self, ids: list[int] | NDArray[np.int64], extra: int = 0) -> NDArray[np.int64]:
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        if arr.size == 0:
            raise ModelError(f"{self.name}: no tokens to run (an empty prompt needs a BOS token)")
        if arr.min() < 0 or arr.max() >= self.vocab_size:
            raise ModelError(f"{self.name}: token id {int(arr.max() if arr.max() >= self.vocab_size else arr.min())} "
                             f"is outside the vocabulary 0..{self.vocab_size - 1}")
        if arr.size + extra > self.config.context_length:
            raise ContextLengthError(
                f"{self.name}: {arr.size} prompt tokens + {extra} new tokens exceed the context of "
                f"{self.config.context_length}; shorten the prompt or ask for fewer tokens"
            )
        return arr

    def check_fits(self, ids: list[int], max_new_tokens: int = 0) -> None:
        """Raise ContextLengthError (or ModelError for bad ids) unless ids + new tokens fit."""
        self._check_ids(ids, max_new_tokens)

    def _hook_fns(self, hooks: HookSpec | None, saes: Sequence[SAE], use_error_term: bool,
                  sae_cache: dict[str, list[NDArray[np.float32]]] | None = None) -> dict[str, Any] | None:
        """`hooks` compiled for the forward pass, then each SAE at its hook point (sae.py) and each
        transcoder in place of its layer's MLP (transcoder.py)."""
        c = self.config
        if not saes:
            return compile_spec(hooks, c.n_layers, c.n_experts)
        tcs = [s for s in saes if isinstance(s, Transcoder)]
        plain = [s for s in saes if not isinstance(s, Transcoder)]
        check_saes(plain, c, self.hook_names())
        check_transcoders(tcs, c)
        on_features = feature_hook_names(saes)  # `{hook}.hook_sae_acts_post`: edits of the features
        spec = {str(k): v for k, v in (hooks or {}).items()}
        feature_fns = {k: intervention_fn(v) for k, v in spec.items() if k in on_features}
        fns = compile_spec({k: v for k, v in spec.items() if k not in on_features}, c.n_layers, c.n_experts)
        fns = attach_saes(plain, fns, use_error_term, sae_cache, feature_fns)
        return attach_transcoders(tcs, fns, use_error_term, c, self.weights.layers, sae_cache, feature_fns)

    def forward(self, ids: list[int] | NDArray[np.int64], hooks: HookSpec | None = None,
                saes: Sequence[SAE] = (), use_error_term: bool = False) -> NDArray[np.float32]:
        """Logits `[seq, vocab]` float32 for every position of `ids` (a fresh cache each call).
        `saes`: each SAE's reconstruction replaces the activation at its hook point (after any hook
        there); `use_error_term` adds the SAE's error back, so the model runs as without it. A hook
        named `{sae.hook_name}.hook_sae_acts_post` edits that SAE's feature activations `(T, d_sae)`
        before they are decoded (e.g. `Zero()` at one position, or a callback zeroing a feature)."""
        arr = self._check_ids(ids)
        fns = self._hook_fns(hooks, saes, use_error_term)
        return self._forward(arr, self.new_cache(len(arr)), fns, all_logits=True)

    def run_with_cache(self, ids: list[int] | NDArray[np.int64], names: list[str] | None = None,
                       hooks: HookSpec | None = None, saes: Sequence[SAE] = (),
                       use_error_term: bool = False) -> tuple[NDArray[np.float32], dict[str, NDArray[np.float32]]]:
        """Logits `[seq, vocab]` and the activations at `names` (default: every hook point),
        each `[seq, ...]`, captured after any intervention in `hooks` (and SAE) at the same point.
        With `saes` (run as in `forward`), also each SAE's `{hook_name}.hook_sae_acts_pre` and
        `.hook_sae_acts_post` `[seq, d_sae]`, `.hook_sae_input`, `.hook_sae_recons`, `.hook_sae_error`
        and `.hook_sae_output` (what the model goes on with) `[seq, d_in]`."""
        arr = self._check_ids(ids)
        n_layers, n_experts = self.config.n_layers, self.config.n_experts
        sae_names = {f"{s.hook_name}.{p}" for s in saes if isinstance(s, SAE) for p in SAE_POINTS}
        if names is None:
            wanted, wanted_sae = self.hook_names(), sae_names
        else:
            wanted = [str(hook_name(n, n_layers, n_experts)) for n in names if n not in sae_names]
            wanted_sae = {n for n in names if n in sae_names}
        pieces: dict[str, list[NDArray[np.float32]]] = {}
        sae_pieces: dict[str, list[NDArray[np.float32]]] = {}
        fns = capture_into(pieces, wanted, self._hook_fns(hooks, saes, use_error_term, sae_pieces))
        logits = self._forward(arr, self.new_cache(len(arr)), fns, all_logits=True)
        pieces |= {n: parts for n, parts in sae_pieces.items() if n in wanted_sae}
        return logits, {name: np.concatenate(parts, axis=0) for name, parts in pieces.items()}

    def next_logits(self, ids: list[int] | NDArray[np.int64], cache: KVCache | None = None,
                    hooks: HookSpec | None = None, saes: Sequence[SAE] = (),
                    use_error_term: bool = False) -> NDArray[np.float32]:
        """Logits `[vocab]` after `ids`, appending them to `cache` (a fresh one if None)."""
        arr = self._check_ids(ids, 0 if cache is None else cache.length)
        fns = self._hook_fns(hooks, saes, use_error_term)
        return self._forward(arr, cache if cache is not None else self.new_cache(len(arr)), fns)

    def next_token(self, ids: list[int] | NDArray[np.int64], cache: KVCache | None = None,
                   hooks: HookSpec | None = None, saes: Sequence[SAE] = (), use_error_term: bool = False) -> int:
        """The greedy next token after `ids`: `int(np.argmax(next_logits(ids, cache, hooks, saes)))`, the same
        id always, faster where the lm_head lets it skip most logits (QuantMatrix.argmax_matvec)."""
        arr = self._check_ids(ids, 0 if cache is None else cache.length)
        fns = self._hook_fns(hooks, saes, use_error_term)
        return self._forward.next_token(arr, cache if cache is not None else self.new_cache(len(arr)), fns)

    def _check_batch(self, batch: Sequence[list[int] | NDArray[np.int64]],
                     caches: list[KVCache] | None) -> tuple[list[NDArray[np.int64]], list[KVCache]]:
        if len(batch) == 0:
            raise ModelError(f"{self.name}: an empty batch (give at least one list of token ids)")
        if caches is not None and len(caches) != len(batch):
            raise ModelError(f"{self.name}: {len(batch)} sequences but {len(caches)} caches (one per sequence)")
        arrs = [self._check_ids(ids, 0 if caches is None else caches[b].length) for b, ids in enumerate(batch)]
        return arrs, caches if caches is not None else [self.new_cache(len(a)) for a in arrs]

    def forward_batch(self, batch: Sequence[list[int] | NDArray[np.int64]], last: Sequence[int] | None = None,
                      caches: list[KVCache] | None = None) -> list[NDArray[np.float32]]:
        """`forward` of each id list, in one pass: logits `[seq_b, vocab]` per sequence (only its
        final `last[b]` positions' if `last` is given, e.g. the positions predicting a target),
        equal to running them one by one within float rounding. The sequences are packed end to
        end (no padding), each attending only to its own earlier positions, after what `caches[b]`
        holds (fresh caches if None); no hooks (run those one by one)."""
        arrs, caches = self._check_batch(batch, caches)
        lens = [len(a) for a in arrs]
        if last is None:
            logits = self._forward.batch(arrs, caches)  # (sum seq_b, vocab)
            return np.split(logits, np.cumsum(lens[:-1]))
        if len(last) != len(arrs) or any(not 1 <= n <= t for n, t in zip(last, lens)):
            raise ModelError(f"{self.name}: `last` must give 1..len(ids) positions for each of the {len(arrs)} sequences")
        ends = np.cumsum(lens)
        rows = np.concatenate([np.arange(e - n, e) for e, n in zip(ends, last)])
        logits = self._forward.batch(arrs, caches, rows)  # (sum last_b, vocab)
        return np.split(logits, np.cumsum(list(last)[:-1]))

    def capture_batch(self, batch: Sequence[list[int] | NDArray[np.int64]], names: Sequence[str],
                      start: int = 0, resid: Sequence[NDArray[np.float32]] | None = None,
                      caches: list[KVCache] | None = None) -> list[dict[str, NDArray[np.float32]]]:
        """The activations at hook points `names` `{name: (seq_b, ...)}` of each id list, from one
        packed pass that stops after the deepest layer named: what `run_with_cache` gives for them,
        for many short prompts at once (editing reads keys and residuals of hundreds). Points inside
        attention (`attn.*`) and the global ones are not offered here: use run_with_cache.
        `resid`: each sequence's residual entering layer `start` `(seq_b, hidden)` (its
        `blocks.{start}.hook_resid_pre`, read before): the pass runs from there, and reads no point
        below `start`. `caches`: each sequence continues after what its cache holds (fresh caches if
        None), and the pass writes its keys and values there for the layers it runs, no others: a
        cache so filled serves only passes that stop as early (`prefix.fork` it for each)."""
        n_layers = self.config.n_layers
        canon = [hook_name(n, n_layers) for n in names]
        bad = [str(h) for h in canon if h.layer is None or h.kind.startswith("attn.")]
        if bad:
            raise ModelError(f"{self.name}: capture_batch reads layer points outside attention, not {bad[0]!r}")
        arrs, caches = self._check_batch(batch, caches)
        x = None
        if resid is not None:
            below = [str(h) for h in canon if int(h.layer or 0) < start]
            if below:
                raise ModelError(f"{self.name}: a pass from layer {start} cannot read {below[0]!r}")
            if len(resid) != len(arrs) or any(r.shape != (len(a), self.config.hidden) for r, a in zip(resid, arrs)):
                raise ModelError(f"{self.name}: `resid` must give one (len(ids), {self.config.hidden}) array per sequence")
            x = np.concatenate(resid).astype(np.float32, copy=False)
        got = self._forward.observe(arrs, caches, {str(h) for h in canon}, max(int(h.layer or 0) for h in canon),
                                    start, x)
        cuts = np.cumsum([len(a) for a in arrs])[:-1]
        per = {str(h): np.split(got[str(h)], cuts) for h in canon}
        return [{n: per[str(h)][b] for n, h in zip(names, canon)} for b in range(len(arrs))]

    def next_logits_batch(self, batch: Sequence[list[int] | NDArray[np.int64]],
                          caches: list[KVCache] | None = None) -> NDArray[np.float32]:
        """`next_logits` of each id list in one pass: `[batch, vocab]`, row b the logits after
        `batch[b]`, appended to `caches[b]` (fresh caches if None). Sequences may differ in length
        and in what their caches hold, so a batch of greedy continuations is one call per step."""
        arrs, caches = self._check_batch(batch, caches)
        return self._forward.batch(arrs, caches, np.cumsum([len(a) for a in arrs]) - 1)  # (batch, vocab)

    def next_top1_batch(self, batch: Sequence[list[int] | NDArray[np.int64]],
                        caches: list[KVCache] | None = None) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """`next_logits_batch`'s argmax per sequence (exactly) and its log-probability (float64),
        `[batch]` each, without the `[batch, vocab]` logits: many greedy continuations at once."""
        arrs, caches = self._check_batch(batch, caches)
        return self._forward.batch_top1(arrs, caches)

    def generate_batch(self, prompts: Sequence[list[int]], max_new_tokens: int = 32,
                       stop_at_eos: bool = True) -> list[list[int]]:
        """Greedy continuations of several prompts (token ids), stepped together: each the ids
        `generate(prompt, max_new_tokens, stop_at_eos=...)` gives (an EOS ends its own sequence)."""
        for p in prompts:
            self._check_ids(p, max_new_tokens)
        caches = [self.new_cache(len(p) + max_new_tokens) for p in prompts]
        out: list[list[int]] = [[] for _ in prompts]
        running, feed = list(range(len(prompts))), [list(p) for p in prompts]
        for _ in range(max_new_tokens):
            if not running:
                break
            logits = self.next_logits_batch(feed, [caches[b] for b in running])  # (running, vocab)
            for b, tok in zip(running, logits.argmax(-1)):
                out[b].append(int(tok))
            running = [b for b in running if not (stop_at_eos and out[b][-1] in self.tokenizer.eos_ids)]
            feed = [[out[b][-1]] for b in running]
        return out

    def stream(self, prompt: str | list[int], max_new_tokens: int = 32, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, seed: int | None = None, stop_at_eos: bool = True,
               hooks: HookSpec | None = None, saes: Sequence[SAE] = (),
               use_error_term: bool = False) -> Iterator[tuple[int, str]]:
        """Yield (token id, newly decodable text) as each token is generated (`saes` as in `forward`,
        at every step)."""
        prompt_ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        arr = self._check_ids(prompt_ids, max_new_tokens)
        params = SamplingParams(temperature, top_k, top_p, seed)
        rng = np.random.default_rng(seed)
        cache = self.new_cache(len(arr) + max_new_tokens)
        fns = self._hook_fns(hooks, saes, use_error_term)  # active at every step, through the KV cache
        greedy = params.temperature <= 0.0
        logits = None if greedy else self._forward(arr, cache, fns)
        tok = self._forward.next_token(arr, cache, fns) if greedy else -1
        new: list[int] = []
        emitted = ""
        for _ in range(max_new_tokens):
            if logits is not None:
                tok = sample(logits, params, rng)
            new.append(tok)
            text = self.detokenize(new)
            if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
                yield tok, text[len(emitted):]
                emitted = text
            else:
                yield tok, ""
            if stop_at_eos and tok in self.tokenizer.eos_ids:
                return
            if len(new) == max_new_tokens:
                return
            step = np.array([tok], dtype=np.int64)
            if greedy:
                tok = self._forward.next_token(step, cache, fns)
            else:
                logits = self._forward(step, cache, fns)

    def generate(self, prompt: str | list[int], max_new_tokens: int = 32, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None, stop_at_eos: bool = True,
                 hooks: HookSpec | None = None, saes: Sequence[SAE] = (), use_error_term: bool = False) -> Generation:
        """Generate up to `max_new_tokens` tokens; greedy unless temperature > 0 (`saes` as in `forward`)."""
        prompt_ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        gen = Generation(prompt_ids=prompt_ids)
        for tok, _ in self.stream(prompt_ids, max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos, hooks,
                                  saes, use_error_term):
            gen.ids.append(tok)
        if gen.ids and stop_at_eos and gen.ids[-1] in self.tokenizer.eos_ids:
            gen.finish_reason = "stop"
        gen.text = self.detokenize(gen.ids)
        return gen
