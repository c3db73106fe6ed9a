"""What an FFN shard's server routes share (vindex_spec/SCALE_OUT.md): the layer or expert range
it computes, parsed from --layers / --experts and checked against the served model at start, and the
model it computes with. The routes are ffn_remote.py (a layer range's FFN) and expert_remote.py (an
expert range); the client is larql/model/remote_ffn.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from larql.errors import ServeError
from larql.grid.layout import parse_range
from larql.serve.http import ServerState

if TYPE_CHECKING:
    from larql.model.model import Model


def parse_layers(text: str, flag: str = "--layers") -> tuple[int, int]:
    """'4-11' -> (4, 11); '7' -> (7, 7): `--layers` or `--experts` of an FFN server."""
    return parse_range(text, flag, "layer" if flag == "--layers" else "expert")


def served_model(server: ServerState) -> Model:
    model = server.served.model
    if model is None:
        raise ServeError("this vindex is browse-level: an FFN server needs model weights (extract it WITH INFERENCE)")
    return model


def served_range(server: ServerState, model: Model) -> tuple[int, int]:
    """The layers this server computes: --layers, or every layer when it serves --experts alone."""
    return server.config.ffn_layers or (0, model.config.n_layers - 1)


def check_range(server: ServerState) -> None:
    """Refuse, at start, a layer (or expert) range the served model does not have."""
    model = served_model(server)
    a, b = served_range(server, model)
    n = model.config.n_layers
    if b >= n:
        raise ServeError(f"--layers {a}-{b}: {server.served.name} has layers 0..{n - 1}")
    if server.config.ffn_experts is not None:
        check_experts(server, model)


def check_experts(server: ServerState, model: Model) -> None:
    """Refuse, at start, an expert range the served model does not have."""
    assert server.config.ffn_experts is not None
    a, b = server.config.ffn_experts
    n = model.config.n_experts
    if not n:
        raise ServeError(f"--experts {a}-{b}: {server.served.name} is not a mixture of experts")
    if b >= n:
        raise ServeError(f"--experts {a}-{b}: {server.served.name} has experts 0..{n - 1}")
