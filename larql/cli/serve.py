"""`larql serve`: its arguments and command. Imports nothing heavy until the command runs, so
`larql --help` stays fast."""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path

from larql.cli.ray_options import add_ray_options, wants_ray, with_ray
from larql.errors import ServeError
from larql.serve.config import Limits, ServeConfig


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ServeError(f"larql serve needs {e.name}: pip install 'larql[serve]'") from e
    from larql.serve.server import serve

    limits = Limits(max_body_bytes=args.max_body, max_statements=args.max_statements, max_tokens=args.max_tokens,
                    timeout_s=args.timeout)
    token = args.token or os.environ.get("LARQL_TOKEN") or None
    if (args.layers or args.experts) and not args.ffn_only:
        raise ServeError(f"{'--layers' if args.layers else '--experts'} goes with --ffn-only (the layer or expert "
                         f"range whose FFN this server computes)")
    ffn_layers = ffn_experts = None
    if args.ffn_only:
        from larql.serve.shard import parse_layers

        if not args.layers and not args.experts:
            raise ServeError("--ffn-only needs --layers A-B or --experts E1-E2 (the layers or experts whose FFN "
                             "this server computes)")
        ffn_layers = parse_layers(args.layers) if args.layers else None
        ffn_experts = parse_layers(args.experts, "--experts") if args.experts else None
    wrap = None
    if wants_ray(args):
        if args.ffn_only:
            raise ServeError("--ray goes without --ffn-only: an FFN server computes its layers itself")
        wrap = partial(with_ray, args=args)
    config = ServeConfig(allow_edits=args.allow_edits, token=token, root=Path.cwd(), limits=limits,
                         workers=args.workers, batch=args.batch, batch_window_ms=args.batch_window_ms,
                         batch_rows=args.batch_rows, solo_rows=args.solo_rows,
                         ffn_layers=ffn_layers, ffn_experts=ffn_experts)
    return serve(args.src, host=args.host, port=args.port, config=config, log_level=args.log_level, wrap=wrap)


def add_commands(sub: argparse._SubParsersAction) -> None:
    d = Limits()
    sv = sub.add_parser("serve", help="serve a vindex or model over HTTP: LQL, REST shortcuts, OpenAI-style "
                                      "completions, a token WebSocket")
    sv.add_argument("src", metavar="VINDEX|MODEL",
                    help="a vindex directory, or a model alias / .gguf / HF directory; or a Hugging Face Hub id of "
                         "either (org/name, hf://org/name@rev)")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    sv.add_argument("--token", default=None, help="write statements need 'Authorization: Bearer TOKEN' "
                                                  "(default: $LARQL_TOKEN, else none)")
    sv.add_argument("--allow-edits", action="store_true",
                    help="accept INSERT / DELETE / UPDATE, the patch statements and COMPILE (each client's edits "
                         "stay in its own session)")
    sv.add_argument("--max-body", type=int, default=d.max_body_bytes, help="request body limit in bytes")
    sv.add_argument("--max-statements", type=int, default=d.max_statements, help="statements per request")
    sv.add_argument("--max-tokens", type=int, default=d.max_tokens, help="tokens one completion may generate")
    sv.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds one request may take")
    sv.add_argument("--workers", type=int, default=4, help="threads running statements and generation")
    sv.add_argument("--batch", type=int, default=16, metavar="N",
                    help="run up to N clients' next-token passes (INFER, completion steps) as one batched forward "
                         "pass (default 16; 0: one by one)")
    sv.add_argument("--batch-window-ms", type=float, default=3.0, metavar="MS",
                    help="how long a batch waits for more passes before it runs (default 3 ms)")
    sv.add_argument("--batch-rows", type=int, default=16, metavar="N",
                    help="at most N token rows in one batched pass (default 16)")
    sv.add_argument("--solo-rows", type=int, default=4, metavar="N",
                    help="a pass of N tokens or more (a prompt) runs alone, not batched (default 4; a large N "
                         "batches prompts and INFER too)")
    sv.add_argument("--ffn-only", action="store_true",
                    help="serve only the FFN of --layers A-B (POST /v1/ffn), for clients run with --ffn URL")
    sv.add_argument("--layers", default=None, metavar="A-B", help="with --ffn-only: the layers whose FFN to serve")
    sv.add_argument("--experts", default=None, metavar="E1-E2",
                    help="with --ffn-only: serve these experts of a mixture of experts (of --layers, or every layer)")
    add_ray_options(sv)
    sv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                    help="uvicorn's log level")
    sv.set_defaults(func=cmd_serve)

