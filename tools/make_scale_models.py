"""Random-weight GGUFs in the shapes of real models (Gemma 3 1B / 4B, Llama 3 1B / 3B / 8B), quantized
by llama.cpp's own quantizer, for measuring speed and memory at the sizes users bring.

    python tools/make_scale_models.py [SHAPE ...] [--out DIR] [--types q4_k_m q8_0] [--seed 0]

--out defaults to scale/ in larql's cache directory ($LARQL_CACHE, else ~/.cache/larql: larql/io/cachedir.py).

Speed, memory and time depend on the shapes and quant types, not on what the weights say, so the
weights are seeded normals (matrices * 0.02, norms 1: activations stay in range over every layer).
The tokenizer and metadata come from the bundled models: Gemma 3 270M's for the Gemma shapes (the
real Gemma 3 vocabulary, 262,144 tokens), SmolLM2-135M's for the Llama shapes (49,152 tokens, not
Llama 3's 128,256: the embedding and lm_head are smaller than the real model's).
Each model is written as F16 one tensor at a time (a row block at a time for the embedding: never the
whole model in memory), quantized through llama-cpp-python (`llama_model_quantize`, a benchmark-only
dependency: `pip install llama-cpp-python`), and the F16 file deleted. Not run by CI: the files are
0.7-8.5 GB each.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SCALE = 0.02  # standard deviation of every matrix's weights
ROW_BLOCK = 8192  # rows generated at a time (the embedding's 262,144 rows come in 32 blocks)


@dataclass(frozen=True)
class Shape:
    """One real model's architecture numbers (from its Hugging Face config.json)."""

    name: str
    base: str  # the bundled model whose tokenizer and metadata are copied
    arch: str
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    rope_base: float
    tied: bool = True
    sliding_window: int = 0
    rope_linear: float = 0.0  # linear RoPE scaling factor of the global layers (Gemma 3 4B: 8)


SHAPES = {s.name: s for s in (
    Shape("gemma3-1b", "gemma3-270m", "gemma3", 1152, 26, 6912, 4, 1, 256, 32768, 1e6, sliding_window=512),
    Shape("gemma3-4b", "gemma3-270m", "gemma3", 2560, 34, 10240, 8, 4, 256, 131072, 1e6, sliding_window=1024,
          rope_linear=8.0),
    Shape("llama3-1b", "smollm2-135m", "llama", 2048, 16, 8192, 32, 8, 64, 131072, 5e5),
    Shape("llama3-3b", "smollm2-135m", "llama", 3072, 28, 8192, 24, 8, 128, 131072, 5e5),
    Shape("llama3-8b", "smollm2-135m", "llama", 4096, 32, 14336, 32, 8, 128, 131072, 5e5, tied=False),
)}

# ftype names -> llama.cpp's enum names (llama_cpp.LLAMA_FTYPE_*)
FTYPES = {"q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}


def tensors(s: Shape, vocab: int) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """(GGUF name, numpy shape (rows, cols), is a norm) of every tensor, in the order llama.cpp writes them."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    yield "token_embd.weight", (vocab, s.hidden), False
    for i in range(s.layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (s.hidden,), True
        yield b + "attn_q.weight", (q, s.hidden), False
        yield b + "attn_k.weight", (kv, s.hidden), False
        yield b + "attn_v.weight", (kv, s.hidden), False
        yield b + "attn_output.weight", (s.hidden, q), False
        if s.arch == "gemma3":
            yield b + "attn_q_norm.weight", (s.head_dim,), True
            yield b + "attn_k_norm.weight", (s.head_dim,), True
            yield b + "post_attention_norm.weight", (s.hidden,), True
        yield b + "ffn_norm.weight", (s.hidden,), True
        yield b + "ffn_gate.weight", (s.ffn, s.hidden), False
        yield b + "ffn_up.weight", (s.ffn, s.hidden), False
        yield b + "ffn_down.weight", (s.hidden, s.ffn), False
        if s.arch == "gemma3":
            yield b + "post_ffw_norm.weight", (s.hidden,), True
    yield "output_norm.weight", (s.hidden,), True
    if not s.tied:
        yield "output.weight", (vocab, s.hidden), False


def arch_metadata(s: Shape, vocab: int) -> dict[str, Any]:
    """The `{arch}.*` keys of the shape (the base model's are dropped and these written instead)."""
    a = s.arch + "."
    meta: dict[str, Any] = {
        a + "context_length": s.context, a + "embedding_length": s.hidden, a + "block_count": s.layers,
        a + "feed_forward_length": s.ffn, a + "attention.head_count": s.heads,
        a + "attention.head_count_kv": s.kv_heads, a + "rope.freq_base": s.rope_base,
    }
    if s.arch == "gemma3":
        meta |= {a + "attention.layer_norm_rms_epsilon": 1e-6, a + "attention.key_length": s.head_dim,
                 a + "attention.value_length": s.head_dim, a + "attention.sliding_window": s.sliding_window}
        if s.rope_linear:
            meta |= {a + "rope.scaling.type": "linear", a + "rope.scaling.factor": s.rope_linear}
    else:
        meta |= {a + "attention.layer_norm_rms_epsilon": 1e-5, a + "rope.dimension_count": s.head_dim,
                 a + "vocab_size": vocab}
    return meta


def _copy_fields(reader: Any, writer: Any, arch: str) -> None:
    """Every key of the base GGUF but its shape, file type and name (the tokenizer, chat template...)."""
    from gguf import GGUFValueType

    skip = ("GGUF.", arch + ".", "general.file_type", "general.name", "general.size_label",
            "general.architecture", "general.quantization_version")
    for field in reader.fields.values():
        if field.name.startswith(skip):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub)


def _write_blocks(writer: Any, nbytes: int, blocks: Iterator[np.ndarray]) -> None:
    """GGUFWriter.write_tensor_data for a tensor given as row blocks (its next tensor info popped,
    the same alignment padding around it), so a 1.3 GB embedding never sits in memory whole."""
    from gguf.gguf_writer import WriterState

    fout = writer.fout[0]
    writer.tensors[0].pop(next(iter(writer.tensors[0])))
    writer.write_padding(fout, fout.tell())
    written = 0
    for block in blocks:
        block.tofile(fout)
        written += block.nbytes
    assert written == nbytes, (written, nbytes)
    writer.write_padding(fout, nbytes)
    writer.state = WriterState.WEIGHTS


def _normal_blocks(shape: tuple[int, ...], seed: int, index: int) -> Iterator[np.ndarray]:
    rng = np.random.default_rng([seed, index])  # one stream per tensor: deterministic, order-independent
    rows, cols = shape
    for r in range(0, rows, ROW_BLOCK):
        n = min(ROW_BLOCK, rows - r)
        yield (rng.standard_normal((n, cols), dtype=np.float32) * SCALE).astype(np.float16)


def write_f16(s: Shape, base: Path, out: Path, seed: int) -> None:
    """The shape's F16 GGUF at `out`, tensor by tensor."""
    import gguf

    reader = gguf.GGUFReader(str(base))
    tokens = reader.fields["tokenizer.ggml.tokens"]
    vocab = len(tokens.data)
    writer = gguf.GGUFWriter(str(out), s.arch)
    writer.add_name(f"larql synthetic {s.name} shape (random weights, seed {seed})")
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in arch_metadata(s, vocab).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    _copy_fields(reader, writer, s.arch)
    specs = list(tensors(s, vocab))
    for name, shape, norm in specs:
        dtype = np.float32 if norm else np.float16
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        raw = gguf.GGMLQuantizationType.F32 if norm else gguf.GGMLQuantizationType.F16
        writer.add_tensor_info(name, shape, np.dtype(dtype), nbytes, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for index, (_name, shape, norm) in enumerate(specs):
        if norm:
            ones = np.ones(shape, dtype=np.float32)
            _write_blocks(writer, ones.nbytes, iter([ones]))
        else:
            _write_blocks(writer, int(np.prod(shape)) * 2, _normal_blocks(shape, seed, index))
    writer.close()


def quantize(src: Path, dst: Path, ftype: str, threads: int) -> None:
    """llama.cpp's quantizer (llama-cpp-python) from src to dst."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[ftype])
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src.name} -> {dst.name}) returned {rc}")


def default_dir() -> Path:
    """Where the models go unless --out says otherwise (benchmarks/bench_scale.py's --dir default too)."""
    from larql.io.cachedir import cache_dir

    return cache_dir() / "scale"


def model_path(out: Path, shape: str, ftype: str) -> Path:
    """Where a shape's quantized file is (benchmarks/bench_scale.py finds them here)."""
    return out / f"{shape}-{ftype}.gguf"


def make(shape: str, out: Path, types: list[str], seed: int, threads: int, keep_f16: bool = False) -> list[Path]:
    """The shape's quantized files (made if missing), the F16 intermediate deleted; with keep_f16 only
    the F16 file (quantized by a later run)."""
    from larql.model.load import resolve

    s = SHAPES[shape]
    targets = [model_path(out, shape, t) for t in types]
    if all(p.is_file() for p in targets):
        return targets
    out.mkdir(parents=True, exist_ok=True)
    f16 = out / f"{shape}-f16.gguf"
    if not f16.is_file():  # a complete one is kept from an interrupted run (written as .part, then renamed)
        t0 = time.perf_counter()
        part = f16.with_name(f16.name + ".part")
        write_f16(s, resolve(s.base)[1], part, seed)
        part.replace(f16)
        print(f"{f16.name}: {f16.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s", flush=True)
    if keep_f16:
        return targets
    try:
        for ftype, path in zip(types, targets):
            if path.is_file():
                continue
            t0 = time.perf_counter()
            part = path.with_name(path.name + ".part")
            quantize(f16, part, ftype, threads)
            part.replace(path)
            print(f"{path.name}: {path.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        f16.unlink(missing_ok=True)
    return targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="*", default=["gemma3-1b", "gemma3-4b"], metavar="SHAPE",
                    help=f"default: gemma3-1b gemma3-4b; any of {', '.join(SHAPES)}")
    ap.add_argument("--out", type=Path, default=None, help="where to write the models (default: scale/ in larql's "
                    "cache directory, $LARQL_CACHE or ~/.cache/larql)")
    ap.add_argument("--types", nargs="+", default=["q4_k_m"], choices=list(FTYPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp quantizer threads")
    ap.add_argument("--f16-only", action="store_true", help="write the F16 files only (quantized by a later run)")
    args = ap.parse_args(argv)
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shape {', '.join(unknown)} (known: {', '.join(SHAPES)})")
    for shape in args.shapes:
        make(shape, args.out or default_dir(), args.types, args.seed, args.threads, args.f16_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
