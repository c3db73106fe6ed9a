"""The --ray options `larql run` and `larql serve` share: the cluster, the shards, and the model
with those shards' FFN on Ray actors (larql/grid/)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from larql.errors import ServeError

if TYPE_CHECKING:
    from larql.model.model import Model


def add_ray_options(parser: argparse.ArgumentParser) -> None:
    ray = parser.add_argument_group("FFN shards on Ray actors (pip install 'larql[ray]')")
    ray.add_argument("--ray", default=None, metavar="local|ADDRESS",
                     help="the Ray cluster: local (started here for this process) or an address (auto: the one "
                          "`ray start` runs on this machine)")
    ray.add_argument("--ray-shards", default=None, metavar="A-B,C-D",
                     help="layer ranges whose FFN runs on Ray actors, one actor per range")
    ray.add_argument("--ray-experts", default=None, metavar="E1-E2,E3-E4",
                     help="expert ranges of a mixture of experts on Ray actors, one actor per range (of every "
                          "layer, or of the one range --ray-shards gives)")
    ray.add_argument("--ray-replicas", type=int, default=1, metavar="N",
                     help="actors per shard, calls going round them (default 1)")
    ray.add_argument("--ray-float16", action="store_true",
                     help="send rows to the shards as float16 (half the bytes; not bit-exact)")
    ray.add_argument("--ray-timeout", type=float, default=60.0, metavar="S",
                     help="seconds a shard may take for one call before it is an error (default 60)")


def wants_ray(args: argparse.Namespace) -> bool:
    return bool(args.ray or args.ray_shards or args.ray_experts)


def with_ray(model: Model, args: argparse.Namespace) -> Model:
    """`model` with --ray-shards' layers (or --ray-experts' experts) on Ray actors."""
    from larql.grid.client import use_ray

    if not args.ray:
        raise ServeError(f"{'--ray-shards' if args.ray_shards else '--ray-experts'} goes with --ray local|ADDRESS "
                         f"(the Ray cluster the shards run on)")
    if not args.ray_shards and not args.ray_experts:
        raise ServeError("--ray needs --ray-shards A-B[,C-D...] (one actor per layer range) or --ray-experts "
                         "E1-E2[,...] (one per expert range)")
    return use_ray(model, args.ray_shards, args.ray_experts, args.ray, replicas=args.ray_replicas,
                   float16=args.ray_float16, timeout=args.ray_timeout)
