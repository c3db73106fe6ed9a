"""Save and load traces: the residual stream and per-layer contributions (vindex_spec/TRACE.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from larql.errors import ModelError, ModelFormatError
from larql.io.tempfiles import clean_stale, publish, temp_path
from larql.model.interp import attribution, logit_lens

if TYPE_CHECKING:
    from larql.model.model import Model

MAGIC, VERSION, HEADER = b"LQTR", 1, 64


def _align(n: int) -> int:
    return -(-n // 64) * 64


@dataclass(frozen=True)
class Trace:
    prompt: str
    token_ids: NDArray[np.uint32]  # (positions,)
    residual: NDArray[np.float32]  # (layers + 1, positions, hidden)
    attn: NDArray[np.float32]  # (layers, positions, hidden)
    ffn: NDArray[np.float32]  # (layers, positions, hidden)

    @property
    def n_layers(self) -> int:
        return int(self.attn.shape[0])

    def lens(self, m: Model, stage: int, position: int = -1) -> NDArray[np.float32]:
        """Log-probabilities of the residual at `stage` (0 = embedding, L + 1 = after layer L)."""
        return logit_lens(m, self.residual[stage, position])

    def contributions(self, m: Model, token: int, position: int = -1) -> NDArray[np.float32]:
        """`(layers, 2)`: attention and FFN contributions unembedded onto `token`."""
        return attribution(m, self.attn[:, position], self.ffn[:, position], token)


def capture_trace(m: Model, prompt: str) -> Trace:
    ids = m.tokenize(prompt)
    n = m.config.n_layers
    names = ["hook_embed"] + [f"blocks.{i}.{k}" for i in range(n) for k in ("hook_resid_mid", "hook_resid_post")]
    _, cache = m.run_with_cache(ids, names=names)
    stages = [cache["hook_embed"]] + [cache[f"blocks.{i}.hook_resid_post"] for i in range(n)]
    residual = np.stack(stages).astype(np.float32)
    mids = np.stack([cache[f"blocks.{i}.hook_resid_mid"] for i in range(n)])
    return Trace(prompt, np.asarray(ids, dtype=np.uint32), residual, mids - residual[:-1], residual[1:] - mids)


def save_trace(trace: Trace, path: str | Path, overwrite: bool = True) -> Path:
    """Write a trace file atomically; without `overwrite` an existing file is refused (ModelError)."""
    path = Path(path)
    clean_stale(path)
    n_layers, n_pos, hidden = trace.attn.shape
    prompt = trace.prompt.encode()
    blocks = [trace.token_ids.astype("<u4").tobytes(), trace.residual.astype("<f4").tobytes(),
              trace.attn.astype("<f4").tobytes(), trace.ffn.astype("<f4").tobytes(),
              len(prompt).to_bytes(4, "little") + prompt]
    offsets, pos = [], HEADER
    for b in blocks:
        offsets.append(pos)
        pos = _align(pos + len(b))
    header = MAGIC + np.array([VERSION, n_layers, n_pos, hidden, 0], "<u4").tobytes() + np.array(offsets, "<u8").tobytes()
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(header.ljust(HEADER, b"\0"))
            for off, b in zip(offsets, blocks):
                f.write(b"\0" * (off - f.tell()))
                f.write(b)
        publish(tmp, path, overwrite)
    except FileExistsError:
        raise ModelError(f"{path}: already exists; add FORCE (TRACE ... SAVE \"{path.name}\" FORCE) to replace it, "
                         f"or choose another path") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def load_trace(path: str | Path, vocab: int = 0) -> Trace:
    """Map a trace file read-only, after checking its header, its block bounds, that every number
    is finite and (given `vocab`) every token id is in the vocabulary.

    Example:
        >>> load_trace("france.trace", vocab=m.vocab_size).lens(m, stage=6)
    """
    path = Path(path)
    if not path.is_file():  # a FIFO or device would block or never end; a directory is no trace
        raise ModelFormatError(f"{path}: no such trace file (or not a regular file)")
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise ModelFormatError(f"{path}: cannot read the trace ({e})") from e
    if len(data) < HEADER or data[:4].tobytes() != MAGIC:
        raise ModelFormatError(f"{path}: not a larql trace (bad magic)")
    version, n_layers, n_pos, hidden, _ = (int(x) for x in data[4:24].view("<u4"))
    if version != VERSION:
        raise ModelFormatError(f"{path}: trace version {version}; this larql reads {VERSION}")
    if not (n_layers and n_pos and hidden):
        raise ModelFormatError(f"{path}: trace header says {n_layers} layers x {n_pos} positions x {hidden} hidden")
    o_ids, o_res, o_attn, o_ffn, o_prompt = (int(x) for x in data[24:64].view("<u8"))
    sizes = [(o_ids, 4 * n_pos), (o_res, 4 * (n_layers + 1) * n_pos * hidden), (o_attn, 4 * n_layers * n_pos * hidden),
             (o_ffn, 4 * n_layers * n_pos * hidden), (o_prompt, 4)]
    if any(off < HEADER or off % 4 or off + size > len(data) for off, size in sizes):
        raise ModelFormatError(f"{path}: truncated trace file (a block lies outside it)")

    def arr(off: int, count: int, dtype: str) -> np.ndarray:
        return data[off: off + count * 4].view(dtype)

    n_prompt = int(data[o_prompt:o_prompt + 4].view("<u4")[0])
    if o_prompt + 4 + n_prompt > len(data):
        raise ModelFormatError(f"{path}: truncated trace file (the prompt runs past the end)")
    prompt = data[o_prompt + 4: o_prompt + 4 + n_prompt].tobytes().decode("utf-8", "replace")
    trace = Trace(prompt, arr(o_ids, n_pos, "<u4"),
                  arr(o_res, (n_layers + 1) * n_pos * hidden, "<f4").reshape(n_layers + 1, n_pos, hidden),
                  arr(o_attn, n_layers * n_pos * hidden, "<f4").reshape(n_layers, n_pos, hidden),
                  arr(o_ffn, n_layers * n_pos * hidden, "<f4").reshape(n_layers, n_pos, hidden))
    for name in ("residual", "attn", "ffn"):
        if not np.all(np.isfinite(getattr(trace, name))):
            raise ModelFormatError(f"{path}: the trace's {name} block has NaN or infinite values")
    if vocab and int(trace.token_ids.max()) >= vocab:
        raise ModelFormatError(f"{path}: token id {int(trace.token_ids.max())} is outside the vocabulary (0..{vocab - 1})")
    return trace
