"""larql: a language model as a database.

The public Python API; everything a user needs is a name here (each resolves on first use, PEP 562:
`import larql` loads no numpy, numba or faiss, and LQL parsing and planning never load the runtime).

    larql.load(src)             a Model: alias / .gguf / HF directory, or a vindex (its walk FFN over an
                                editable view, so edits to the view show in the model)
    larql.open_vindex(path)     a Vindex, read-only: .describe / .walk / .nearest, gate KNN, metadata
    larql.use_ray(model, layers="4-7,8-11")   the model with those layers' FFN on Ray actors (larql[ray])
    larql.load_sae(path)        an SAE (SAELens' format) to run inside a Model's forward pass (saes=[...])
    larql.edit_vindex(path)     an EditableVindex (store + overlay + patches): .insert(facts) and the same reads
    larql.execute(text)         run LQL statements: a list of Result (a Session carries USE and edits)
    larql.parse(text)           LQL text to statements (nothing runs)
    Model, Vindex, EditableVindex, Result, Session, Fact, InsertReport, CrownReport, SAE
    larql.hooks                 hook names and interventions (Replace, Add, Scale, Zero, Knockout, TopK)
    larql.interp                logit lens, attribution, patching, steering, attention patterns
    larql.plot                  pictures of results (the extra `larql[plot]`)
    LarqlError and the errors under it (larql.errors)

`import larql` sets the thread pools as `larql run` does (numba, OpenMP, BLAS; threads.configure), so
a script decodes at the CLI's speed; variables the user set already are left alone.

The packages, each importing only those below it (tests/test_layering.py):

    cli/ shell/ serve/ vindexfile/   the command line, the REPL, the server, Vindexfile builds (__main__.py)
    (this facade)
    lql/        the query language: grammar, planner, executor
    grid/       the FFN spread over Ray actors: layer and expert shards, replicas, retries
    edit/       editing a vindex: patches, methods, measurement, maintenance, baking
    vindex/     the read-only store: extraction, verification, gate KNN, DESCRIBE
    model/      loading and running models, hooks, interpretability
    quant/      quantized tensors and their kernels
    errors.py, threads.py, version.py, io/   leaves
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from larql import threads as _threads
from larql.errors import (
    AccessError,
    BuildError,
    ContextLengthError,
    EditError,
    EmptyTargetError,
    LarqlError,
    LimitError,
    LqlError,
    LqlSemanticError,
    LqlSyntaxError,
    ModelError,
    ModelFormatError,
    QuantError,
    RemoteError,
    ServeError,
    TokenizerError,
    UnknownModelError,
    UnsupportedError,
    VindexError,
)
from larql.version import __version__

if TYPE_CHECKING:
    from larql.edit.insert import InsertReport
    from larql.edit.methods.facts import Fact
    from larql.edit.state.view import EditableVindex
    from larql.lql.ast import Statement
    from larql.lql.result import Result
    from larql.lql.session import Session
    from larql.model.crown import CrownReport
    from larql.model.model import Model
    from larql.model.sae import SAE
    from larql.model.transcoder import Transcoder
    from larql.vindex.store import Vindex

_threads.configure()

_CLASSES = {"Model": "larql.model.model", "Vindex": "larql.vindex.store", "EditableVindex": "larql.edit.state.view",
            "Result": "larql.lql.result", "Session": "larql.lql.session", "Fact": "larql.edit.methods.facts",
            "InsertReport": "larql.edit.insert", "CrownReport": "larql.model.crown",
            "SAE": "larql.model.sae", "Transcoder": "larql.model.transcoder"}
# modules the facade names: `larql.hooks.Zero(...)`, `from larql import plot` (presentation code)
_MODULES = {"hooks": "larql.model.hooks", "interp": "larql.model.interp", "plot": "larql.shell.plot"}

__all__ = [
    "SAE", "AccessError", "BuildError", "ContextLengthError", "CrownReport", "EditError", "EditableVindex",
    "EmptyTargetError", "Fact", "InsertReport", "LarqlError", "LimitError", "LqlError", "LqlSemanticError",
    "LqlSyntaxError", "Model", "ModelError", "ModelFormatError", "QuantError", "RemoteError", "Result",
    "ServeError", "Session", "TokenizerError", "Transcoder", "UnknownModelError", "UnsupportedError", "Vindex", "VindexError", "__version__",
    "edit_vindex", "execute", "hooks", "interp", "load", "load_sae", "open_vindex", "parse", "plot", "use_ray",
]


def load(src: str | Path) -> Model:
    """Load a model: a bundled alias (`gemma3-270m`, `smollm2-135m`), a GGUF file, an HF directory,
    or an inference-level vindex directory (the model it carries, its FFN the walk FFN over an
    editable view of the vindex; `.dense()` is the same model without it).

    Weights stay memory-mapped in their stored quantization; nothing is dequantized up front.

    Example:
        >>> m = larql.load("gemma3-270m")
        >>> m.generate("The capital of France is", max_new_tokens=4).text
    """
    from larql.edit.state.load_any import load_any

    return load_any(src)


def use_ray(model: Model, layers: str | None = None, experts: str | None = None, address: str = "local",
            src: str | None = None, replicas: int = 1, float16: bool = False, timeout: float = 60.0) -> Model:
    """`model` with the FFN of `layers` ("4-7,8-11", one Ray actor per range) or of `experts`
    ("0-1,2-3" of a mixture of experts, one actor per range) computed on Ray actors, `replicas` per
    shard, on the cluster at `address` ("local" starts one on this machine, "auto" joins `ray start`'s).
    The actors open `src` (default: what the model was loaded from); float32 rows both ways (the local
    model bit for bit) unless `float16`; a call past `timeout` seconds is an error. Needs `larql[ray]`.

    Example:
        >>> m = larql.use_ray(larql.load("gemma3-270m"), layers="4-7,8-11")
        >>> m.generate("The capital of France is", max_new_tokens=4).text
    """
    from larql.grid.client import use_ray as start

    return start(model, layers, experts, address, src, replicas, float16, timeout)


def load_sae(path: str | Path) -> SAE:
    """A sparse autoencoder from a directory in SAELens' format (cfg.json and
    sae_weights.safetensors: ReLU, JumpReLU or top-k), or from a Hub repository's folder of one
    (`hf://org/name[@rev]/folder`), to run at its hook point with
    `m.forward(ids, saes=[sae])`, `m.run_with_cache(ids, saes=[sae])` or `m.generate(..., saes=[sae])`.
    A transcoder's directory (ReLU or JumpReLU, with or without W_skip) gives a `Transcoder`, which
    the same calls run in place of its layer's MLP.

    Example:
        >>> sae = larql.load_sae("saes/blocks.6.hook_resid_post")
        >>> _, cache = m.run_with_cache(ids, saes=[sae]); cache[f"{sae.hook_name}.hook_sae_acts_post"]
    """
    from larql.model.sae_load import load_sae as load_dir

    return load_dir(path)


def open_vindex(path: str | Path) -> Vindex:
    """Open a vindex read-only, verified first (index.json: schema, consistency, seal; every file: sha256).

    Example:
        >>> v = larql.open_vindex("g.vindex")
        >>> v.gate_knn(10, v.entity_embedding("France"), k=5)
    """
    from larql.vindex.store import open_vindex as open_store

    return open_store(path)


def edit_vindex(path: str | Path) -> EditableVindex:
    """Open a vindex for editing: the read-only store wrapped in an EditableVindex, whose overlay
    (empty at first) INSERT / DELETE / UPDATE / APPLY PATCH fill; the files are never written.

    Example:
        >>> v = larql.edit_vindex("g.vindex")
        >>> v.patches.apply("fiction.vlp"); v.model().generate("The capital of Atlantis is", 3).text
    """
    from larql.edit.state.view import edit_vindex as open_view

    return open_view(path)


def execute(text: str, session: Session | None = None) -> list[Result]:
    """Run LQL `text` (one or more statements) and return each statement's Result. A `Session`
    carries what statements share (USE, the open vindex and its edits) from one call to the next.

    Example:
        >>> s = larql.Session()
        >>> larql.execute('USE "g.vindex"; DESCRIBE "France";', s)[-1].to_pandas()
    """
    from larql.lql.executor import execute as run

    return run(text, session)


def parse(text: str) -> list[Statement]:
    """LQL `text` as statements (the AST; `larql.lql.unparse` turns them back into text)."""
    from larql.lql.parser import parse as parse_text

    return parse_text(text)


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    home = _CLASSES.get(name)
    if home is None:
        raise AttributeError(f"module 'larql' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
