"""What `larql serve` was started with: who may write, where paths may point, and the limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1_000_000  # a request body (LQL text or JSON) larger than this is refused (413)
    max_statements: int = 32  # statements per /v1/lql request
    max_tokens: int = 512  # tokens one completion may ask for
    timeout_s: float = 120.0  # wall time for one request (a long INSERT on a real model takes tens of seconds)
    max_queued: int = 64  # work items waiting for or holding a worker thread; past it new work gets a 503
    max_sessions: int = 32  # clients holding edits at once
    session_idle_s: float = 3600.0  # a session unused this long is dropped with its edits


@dataclass(frozen=True)
class ServeConfig:
    allow_edits: bool = False
    token: str | None = None  # when set, write statements need 'Authorization: Bearer <token>'
    root: Path = field(default_factory=Path.cwd)  # statements' paths must stay under it
    limits: Limits = field(default_factory=Limits)
    workers: int = 4  # threads running statements and generation (numba releases the GIL in its kernels)
    batch: int = 16  # at most this many next-token passes (INFER, generation steps) in one batched pass; 0: none
    batch_window_ms: float = 3.0  # how long a batch gathers before it runs (at once when full)
    batch_rows: int = 16  # at most this many token rows in one batched pass (the small-batch matmuls' range)
    solo_rows: int = 4  # a pass of this many tokens or more (a prompt) runs at once on its own, not batched
    ffn_layers: tuple[int, int] | None = None  # --ffn-only --layers A-B: serve only these layers' FFN
    ffn_experts: tuple[int, int] | None = None  # --ffn-only --experts E1-E2: only these experts (of --layers or all)

    @property
    def ffn_only(self) -> bool:
        return self.ffn_layers is not None or self.ffn_experts is not None
