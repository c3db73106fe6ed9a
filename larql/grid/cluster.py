"""Ray itself: joining a cluster (or starting one on this machine), starting the shard actors, and one
call to a shard with the faults handled: calls go round the shard's replicas, a call that meets a
restarting actor is tried again until the timeout, an actor dead for good leaves the rotation, and a
call past the timeout is reported, not waited on. Ray is imported only when a function runs (here,
and in shard.py to read an edit snapshot): `larql[ray]` is an optional extra."""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from larql.errors import LarqlError, RemoteError, ServeError
from larql.grid.layout import Shard
from larql.grid.shard import FFNShard

MISSING = "Ray is not installed: pip install 'larql[ray]'"


def import_ray() -> Any:
    """The ray module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ServeError(MISSING) from None
    return ray


def connect(address: str, num_cpus: float | None = None) -> None:
    """Join the Ray cluster at `address` ("auto": the one `ray start` runs here), or with "local"
    start one on this machine with the cores as its CPUs, or `num_cpus` (what the actors reserve) when more. A process
    already connected stays on its cluster."""
    ray = import_ray()
    if ray.is_initialized():
        return
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    if address == "local":
        cpus = max(os.cpu_count() or 1, math.ceil(num_cpus or 0))
        ray.init(num_cpus=cpus, include_dashboard=False, **quiet)
        return
    reachable(address)
    try:
        ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RemoteError(f"cannot join the Ray cluster at {address} ({str(e).splitlines()[0]}); start one with "
                          f"`ray start --head`, or use --ray local") from None


def reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse at once an address nothing listens on (Ray itself keeps retrying for minutes)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ServeError(f"--ray {address}: give local, auto, or a cluster's HOST:PORT (ray://HOST:PORT for Ray "
                         f"Client)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise RemoteError(f"cannot reach the Ray cluster at {address} ({e.strerror or e}); start one with "
                          f"`ray start --head`, or use --ray local") from None


@dataclass(frozen=True)
class Options:
    """How shards run and are called. `timeout`: seconds one call may take (a restarting actor is
    waited for within it); `float16`: rows on the wire as float16 (half the bytes, not bit-exact);
    `cpus`: Ray CPUs each actor reserves (placement); `max_restarts`: how often Ray restarts a dead
    actor; `latency`: seconds each shard sleeps before answering (a simulated network)."""

    replicas: int = 1
    float16: bool = False
    timeout: float = 60.0
    start_timeout: float = 600.0
    cpus: float = 1.0
    max_restarts: int = 3
    latency: float = 0.0


class ShardGroup:
    """One shard's actors (its replicas), and calls to them."""

    def __init__(self, shard: Shard, actors: list[Any], options: Options) -> None:
        self.shard, self.actors, self.options = shard, list(actors), options
        self.turn = 0
        self.calls = [0] * len(actors)  # calls answered by each actor, by its place in `actors`

    def call(self, what: str, method: str, *args: Any) -> Any:
        """`method(*args)` on one of the shard's actors, in turn; `what` names the call in errors."""
        return self.submit(what, method, *args)()

    def submit(self, what: str, method: str, *args: Any) -> Callable[[], Any]:
        """Send the call now (to the next actor in turn); the function returned waits for its answer,
        trying again as `call` says."""
        deadline = time.monotonic() + self.options.timeout
        sent = self._send(method, args)
        return lambda: self._wait(what, method, args, sent, deadline)

    def _send(self, method: str, args: tuple[Any, ...]) -> tuple[int, Any] | None:
        live = [k for k, a in enumerate(self.actors) if a is not None]
        if not live:
            return None
        k = live[self.turn % len(live)]
        self.turn += 1
        return k, getattr(self.actors[k], method).remote(*args)

    def _wait(self, what: str, method: str, args: tuple[Any, ...], sent: tuple[int, Any] | None,
              deadline: float) -> Any:
        ray = import_ray()
        from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayTaskError

        pause, reason = 0.05, ""
        while True:
            if sent is None:
                raise RemoteError(f"the Ray shard of {self.shard.label()} is gone: every replica died ({reason}); "
                                  f"start the shards again")
            k, ref = sent
            try:
                out = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
                self.calls[k] += 1
                return out
            except GetTimeoutError:
                ray.cancel(ref)
                raise RemoteError(f"the Ray shard of {self.shard.label()} did not answer {what} within "
                                  f"{self.options.timeout:g} s (a slow or stuck shard; --ray-timeout sets the "
                                  f"limit)") from None
            except RayTaskError as e:
                cause = e.cause
                detail = str(cause) if isinstance(cause, LarqlError) else f"{type(cause).__name__}: {cause}"
                raise RemoteError(f"the Ray shard of {self.shard.label()} refused {what}: {detail}") from None
            except ActorDiedError as e:  # dead for good (restarts used up, or killed without restart)
                self.actors[k] = None
                reason = _first_line(e)
            except RayActorError as e:  # restarting, or died with the call in flight: try again
                reason = _first_line(e)
                if time.monotonic() + pause > deadline:
                    raise RemoteError(f"the Ray shard of {self.shard.label()} did not come back within "
                                      f"{self.options.timeout:g} s for {what} ({reason})") from None
                time.sleep(pause)
                pause = min(1.0, pause * 2)
            sent = self._send(method, args)

    def kill(self) -> None:
        """End the shard's actors (they also end with the process that started them)."""
        ray = import_ray()
        for a in self.actors:
            if a is not None:
                ray.kill(a, no_restart=True)
        self.actors = [None] * len(self.actors)


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def start_groups(src: str, shards: list[Shard], options: Options) -> list[ShardGroup]:
    """Start `options.replicas` actors per shard on the connected cluster, each opening `src`, and
    wait until each has run its layers once (kernels compiled, pages read)."""
    ray = import_ray()
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    actor = ray.remote(FFNShard).options(num_cpus=options.cpus, max_restarts=options.max_restarts,
                                         max_task_retries=0)
    groups = [ShardGroup(s, [actor.remote(src, s, options.latency) for _ in range(options.replicas)], options)
              for s in shards]
    pending = {g.actors[k].warm.remote(): g for g in groups for k in range(len(g.actors))}
    try:
        ray.get(list(pending), timeout=options.start_timeout)
    except GetTimeoutError:
        raise RemoteError(f"the Ray shards did not start within {options.start_timeout:g} s (not enough CPUs "
                          f"in the cluster for {sum(len(g.actors) for g in groups)} actors of {options.cpus:g} "
                          f"CPU each?)") from None
    except (RayTaskError, RayActorError) as e:
        cause = getattr(e, "cause", None) or e
        g = next((g for ref, g in pending.items() if _failed(ray, ref)), groups[0])
        for group in groups:
            group.kill()
        raise RemoteError(f"the Ray shard of {g.shard.label()} could not start: {_first_line(cause)}") from None
    return groups


def _failed(ray: Any, ref: Any) -> bool:
    try:
        ray.get(ref, timeout=0)
    except Exception:
        return True
    return False
