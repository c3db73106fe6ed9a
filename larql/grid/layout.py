"""Which shard computes what: layer ranges of the FFN, or expert ranges of a mixture of experts,
parsed from the command line's spelling (`4-7,8-11`) and checked against the model before any actor
starts. Nothing here imports Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from larql.errors import ServeError

if TYPE_CHECKING:
    from larql.model.config import ModelConfig


@dataclass(frozen=True)
class Shard:
    """One shard: the FFN of layers `layers` (inclusive), or with `experts`, those experts of the
    layers in `layers` that have a router."""

    layers: tuple[int, int]
    experts: tuple[int, int] | None = None

    def label(self) -> str:
        """How errors name the shard: 'layers 4-7', 'experts 0-1 of layers 0-3'."""
        a, b = self.layers
        if self.experts is None:
            return f"layers {a}-{b}"
        return f"experts {self.experts[0]}-{self.experts[1]} of layers {a}-{b}"

    def has_layer(self, layer: int) -> bool:
        return self.layers[0] <= layer <= self.layers[1]

    def has_expert(self, expert: int) -> bool:
        return self.experts is not None and self.experts[0] <= expert <= self.experts[1]


def parse_range(text: str, flag: str, what: str = "layer") -> tuple[int, int]:
    """'4-11' -> (4, 11); '7' -> (7, 7)."""
    lo, _, hi = text.strip().partition("-")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise ServeError(f"{flag}: {text!r} is not a{'n' if what == 'expert' else ''} {what} range such as "
                         f"4-7") from None
    if not 0 <= a <= b:
        raise ServeError(f"{flag}: the range {text} must run upwards from {what} 0 or later")
    return a, b


def parse_ranges(text: str, flag: str, what: str = "layer") -> list[tuple[int, int]]:
    """'4-7,8-11' -> [(4, 7), (8, 11)]."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ServeError(f"{flag} needs one {what} range or more, such as 4-7,8-11")
    return [parse_range(p, flag, what) for p in parts]


def layout(cfg: ModelConfig, layers: str | None = None, experts: str | None = None) -> list[Shard]:
    """The shards `--ray-shards` (layer ranges) and `--ray-experts` (expert ranges of every layer
    with a router, or of the one layer range `--ray-shards` gives) describe, checked against `cfg`."""
    if layers is None and experts is None:
        raise ServeError("Ray shards need --ray-shards A-B[,C-D...] (layer ranges) or --ray-experts E1-E2[,...] "
                         "(expert ranges)")
    spans = parse_ranges(layers, "--ray-shards") if layers is not None else [(0, cfg.n_layers - 1)]
    if experts is None:
        shards = [Shard(s) for s in spans]
    else:
        if len(spans) != 1:
            raise ServeError("with --ray-experts, --ray-shards gives one layer range (the layers whose experts the "
                             "shards compute)")
        shards = [Shard(spans[0], e) for e in parse_ranges(experts, "--ray-experts", "expert")]
    check(shards, cfg)
    return shards


def check(shards: list[Shard], cfg: ModelConfig) -> None:
    """Refuse a layout the model does not have: a layer or expert past its last, overlapping ranges
    (a range computed twice is what replicas are for), experts of a dense model."""
    for s in shards:
        if s.layers[1] >= cfg.n_layers:
            raise ServeError(f"Ray shard of {s.label()}: the model has layers 0-{cfg.n_layers - 1}")
        if s.experts is not None:
            if not cfg.n_experts:
                raise ServeError(f"Ray shard of {s.label()}: the model is not a mixture of experts")
            if s.experts[1] >= cfg.n_experts:
                raise ServeError(f"Ray shard of {s.label()}: the model has experts 0-{cfg.n_experts - 1}")
    for k, s in enumerate(shards):
        for t in shards[k + 1:]:
            layers_meet = s.layers[0] <= t.layers[1] and t.layers[0] <= s.layers[1]
            experts_meet = (s.experts is None or t.experts is None
                            or (s.experts[0] <= t.experts[1] and t.experts[0] <= s.experts[1]))
            if layers_meet and experts_meet:
                raise ServeError(f"Ray shards of {s.label()} and {t.label()} overlap; give each layer (or expert) "
                                 f"to one shard, and use replicas to run a shard twice")
