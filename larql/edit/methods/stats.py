"""Key statistics for weight edits: C = E[k k^T] of a layer's down-projection input.

ROME and MEMIT weight their update by C^-1 so that the edit changes the layer's output as little
as possible on the keys the layer usually sees; so C should come from the kind of text edits are
asked about. It is estimated here from text that needs no download, in 128-token chunks, in this
order: English that gemma3-270m wrote itself (`data/stats_corpus_generated.txt`, ~20k tokens of
seeded continuations of 40 generic openings, made by `tools/make_stats_corpus.py` and shipped so
that nobody waits for it), then a short general-English text written for larql
(`data/stats_corpus.txt`), then CPython's reference prose (`pydoc_data.topics`, on every Python
install) for budgets beyond: on stacked ROME edits of gemma3-270m, C from the model's own text
scored higher on every editing measure than C from reference prose first. The forward pass stops
after the deepest layer asked for.

Computed once per (model, layer, corpus, token count) and cached as `.npz` (written atomically,
with a sha256 of the matrix checked on load) in a directory the caller names — beside the vindex
for `edit_vindex`, else larql's cache directory. `benchmarks/bench_editing.py --stats-tokens N`
measures how the token count changes an edit's specificity;
DEFAULT_TOKENS is the chosen size.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numpy.typing import NDArray

from larql.edit.methods.capture import BATCH_ROWS, capture_batch
from larql.errors import EditError
from larql.io.tempfiles import write_cache
from larql.model.forward import norm

if TYPE_CHECKING:
    from larql.model.model import Model

F64 = NDArray[np.float64]
DEFAULT_TOKENS = 16384  # 8 x gemma3-270m's 2048 keys: see token_budget
TOKENS_PER_KEY = 8
CHUNK = 128
STATS_VERSION = 2  # 2: the generated English corpus first


class Moments(NamedTuple):
    cov: F64  # (width, width) E[k k^T]
    tokens: int  # tokens counted
    mean: F64  # (width,) E[k]: METHOD NEURON's bias direction comes from it (`neuron.bias_direction`)


def token_budget(ffn: int) -> int:
    """Statistics tokens for a layer of `ffn` keys: TOKENS_PER_KEY per key, at most DEFAULT_TOKENS
    (C needs several times more tokens than it has dimensions to be well conditioned)."""
    return max(1024, min(DEFAULT_TOKENS, TOKENS_PER_KEY * ffn))


GENERATED_SEPARATOR = "\n\n<|larql-doc|>\n\n"  # between samples in stats_corpus_generated.txt


def corpus_text() -> str:
    """The statistics corpus: model-written English, larql's own text, then CPython's reference prose."""
    from pydoc_data import topics

    data = Path(__file__).with_name("data")
    generated = (data / "stats_corpus_generated.txt").read_text(encoding="utf-8").split(GENERATED_SEPARATOR)
    shipped = (data / "stats_corpus.txt").read_text(encoding="utf-8")
    return "\n\n".join([*generated, shipped, *(topics.topics[k] for k in sorted(topics.topics))])


def corpus_chunks(model: Model, n_tokens: int) -> list[list[int]]:
    """Token chunks (BOS + up to CHUNK - 1 tokens each) covering about `n_tokens` tokens."""
    ids = model.tokenizer.tok.encode(corpus_text(), add_special_tokens=False).ids
    if len(ids) < n_tokens:
        raise EditError(f"the statistics corpus has {len(ids)} tokens, fewer than the {n_tokens} asked for")
    bos = [model.tokenizer.bos_id] if model.tokenizer.bos_id is not None else []
    step = min(CHUNK, model.config.context_length) - len(bos)
    return [bos + list(ids[i: i + step]) for i in range(0, n_tokens, step)]


# What the statistics are of: "key", the down projection's input (`blocks.L.mlp.hook_post`, ffn wide:
# ROME / MEMIT); "input", the MLP's normalised input (hidden wide: the gate of METHOD NEURON).
POINTS = ("key", "input")


def _width(model: Model, point: str) -> int:
    return model.config.ffn if point == "key" else model.config.hidden


def compute_second_moments(model: Model, layers: list[int], n_tokens: int = DEFAULT_TOKENS,
                           point: str = "key") -> dict[int, Moments]:
    """{layer: E[k k^T], tokens counted, E[k]} (float64) of `point` at every position of the corpus
    chunks except BOS."""
    if point not in POINTS:
        raise EditError(f"unknown statistics point {point!r} (one of {', '.join(POINTS)})")
    width = _width(model, point)
    sums = {layer: np.zeros((width, width), np.float64) for layer in layers}
    firsts = {layer: np.zeros(width, np.float64) for layer in layers}
    count = 0
    hook = "mlp.hook_post" if point == "key" else "hook_resid_mid"
    names = {layer: f"blocks.{layer}.{hook}" for layer in layers}
    chunks = corpus_chunks(model, n_tokens)
    per_pass = max(1, BATCH_ROWS // CHUNK)  # chunks packed per forward pass, summed before the next
    for chunk, got in ((c, g) for i in range(0, len(chunks), per_pass)
                       for c, g in zip(chunks[i: i + per_pass],
                                       capture_batch(model, chunks[i: i + per_pass], list(names.values())))):
        for layer, name in names.items():
            k = got[name][1:]  # (T-1, width) without BOS, whose keys are off the scale
            if point == "input":
                k = norm(model.config, k, model.weights.layers[layer].ffn_norm)
            k = k.astype(np.float64)
            sums[layer] += k.T @ k
            firsts[layer] += k.sum(axis=0)
        count += len(chunk) - 1
    return {layer: Moments(s / count, count, firsts[layer] / count) for layer, s in sums.items()}


def _fingerprint(model: Model) -> str:
    c = model.config
    w = model.weights.layers[0].down
    assert w is not None  # a dense FFN (weight edits refuse a mixture of experts)
    probe = np.asarray(w.raw[:4]).tobytes()  # a few stored bytes: a different checkpoint differs here
    return hashlib.sha256(f"{c}|{model.name}|{STATS_VERSION}".encode() + probe).hexdigest()[:16]


def _path(directory: Path, model: Model, layer: int, n_tokens: int, point: str = "key") -> Path:
    kind = "cov" if point == "key" else f"cov-{point}"
    return directory / f"{kind}-{_fingerprint(model)}-L{layer}-{n_tokens}.npz"


# the arrays a cache file holds: name -> (shape, given the layer's ffn; dtype kind)
def _layout(width: int) -> dict[str, tuple[tuple[int, ...], str]]:
    return {"cov": ((width, width), "f"), "mean": ((width,), "f"), "count": ((), "i"), "sha256": ((), "U")}


def _digest(cov32: np.ndarray, mean32: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(cov32).tobytes() + np.ascontiguousarray(mean32).tobytes()).hexdigest()


def _member(z: zipfile.ZipFile, name: str, shape: tuple[int, ...], kind: str) -> np.ndarray | None:
    """One array of the .npz, read only if its header declares the shape and dtype expected (so a
    hostile header cannot make us allocate), never unpickled."""
    with z.open(f"{name}.npy") as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            return None
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        got_shape, _, dtype = read_header(f)
    if got_shape != shape or dtype.kind != kind or dtype.hasobject:
        return None
    with z.open(f"{name}.npy") as f:
        return np.lib.format.read_array(f, allow_pickle=False)


def _load(path: Path, width: int) -> Moments | None:
    """Cached moments, or None when there are none or they are not exactly what we wrote (then they
    are recomputed): a member missing (a cache from before the mean was kept), wrong shapes or
    dtypes, a checksum mismatch, non-finite values, a bad count."""
    try:
        with zipfile.ZipFile(path) as z:
            got = {name: _member(z, name, shape, kind) for name, (shape, kind) in _layout(width).items()}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    cov, mean, count_arr, digest_arr = got["cov"], got["mean"], got["count"], got["sha256"]
    if cov is None or mean is None or count_arr is None or digest_arr is None:
        return None
    count, digest = int(count_arr), str(digest_arr)
    if _digest(cov, mean) != digest:
        return None  # damaged: recompute
    if count < 1 or not (np.all(np.isfinite(cov)) and np.all(np.isfinite(mean))):
        return None
    return Moments(cov.astype(np.float64), count, mean.astype(np.float64))


def _save(path: Path, moments: Moments) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cov32 = np.ascontiguousarray(moments.cov, dtype=np.float32)
    mean32 = np.ascontiguousarray(moments.mean, dtype=np.float32)
    # a cache that cannot be written is recomputed next time
    write_cache(path, lambda f: np.savez(f, cov=cov32, mean=mean32, count=np.int64(moments.tokens),
                                         sha256=_digest(cov32, mean32)))


def _as_stored(a: F64) -> F64:
    return a.astype(np.float32).astype(np.float64)


def second_moments(model: Model, layers: list[int], directory: Path | None, n_tokens: int = DEFAULT_TOKENS,
                   point: str = "key") -> dict[int, Moments]:
    """E[k k^T] (and E[k]) of `point` per layer, from the cache in `directory` when present and
    intact, else computed (and cached when `directory` is given)."""
    out: dict[int, Moments] = {}
    missing = []
    width = _width(model, point)
    for layer in layers:
        hit = _load(_path(directory, model, layer, n_tokens, point), width) if directory is not None else None
        if hit is not None:
            out[layer] = hit
        else:
            missing.append(layer)
    if missing:
        fresh = compute_second_moments(model, missing, n_tokens, point)
        for layer, got in fresh.items():
            if directory is not None:
                _save(_path(directory, model, layer, n_tokens, point), got)
            # what a cache hit would give
            out[layer] = Moments(_as_stored(got.cov), got.tokens, _as_stored(got.mean))
    return out
