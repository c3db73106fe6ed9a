"""`larql run MODEL [PROMPT]`: generate text from a model (streamed), print the next-token
distribution with --top, or, without a prompt, chat in the terminal (cli/chat.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from larql.cli.ray_options import add_ray_options, wants_ray, with_ray
from larql.errors import LarqlError


def _top_table(model, logits, k: int) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    import numpy as np

    from larql.model.generate import log_softmax
    from larql.model.interp import top_tokens

    logp = log_softmax(logits)
    top = top_tokens(logits, k)
    return [{"rank": r + 1, "id": int(i), "token": model.tokenizer.token_text(int(i)),
             "logit": float(logits[i]), "prob": float(np.exp(logp[i]))} for r, i in enumerate(top)]


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    import larql

    if args.prompt is None and (args.top or args.json):
        sys.stderr.write("larql: error: --top and --json need a prompt (without one, larql run opens a chat)\n")
        return 2
    from larql.model.prewarm import start

    start(args.model)  # a fresh install: a second process compiles the kernels the run reaches last
    model = larql.load(args.model)
    if args.ffn:
        try:
            from larql.model.remote_ffn import use_remote_ffn
        except ImportError as e:
            raise LarqlError(f"--ffn needs {e.name}: pip install 'larql[serve]'") from e
        for url in args.ffn:  # shards compose: each takes its layers (or experts) from the model before it
            model = use_remote_ffn(model, url)
    if wants_ray(args):
        model = with_ray(model, args)
    out = sys.stdout
    if args.prompt is None:
        from larql.cli.chat import run_chat

        return run_chat(model, args)
    if args.top:
        ids = model.tokenize(args.prompt)
        t0 = time.perf_counter()
        rows = _top_table(model, model.next_logits(ids), args.top)
        elapsed = time.perf_counter() - t0
        if args.json:
            json.dump({"model": model.name, "prompt": args.prompt, "ids": ids, "top": rows,
                       "seconds": round(elapsed, 4)}, out, ensure_ascii=False)
            out.write("\n")
            return 0
        table = Table(title=f"next token after {args.prompt!r} ({model.name})")
        for col in ("rank", "id", "token", "logit", "prob"):
            table.add_column(col, justify="left" if col == "token" else "right")
        for r in rows:
            table.add_row(str(r["rank"]), str(r["id"]), repr(r["token"]), f"{r['logit']:.3f}", f"{r['prob']:.4f}")
        Console(file=out).print(table)
        return 0
    t0 = time.perf_counter()
    prompt_ids = model.tokenize(args.prompt)
    model.check_fits(prompt_ids, args.max_tokens)  # fail before anything is printed
    ids = []
    first = None
    if not args.json:
        out.write(args.prompt)
        out.flush()
    for tok, piece in model.stream(prompt_ids, max_new_tokens=args.max_tokens, temperature=args.temperature,
                                   top_k=args.top_k, top_p=args.top_p, seed=args.seed):
        first = first or time.perf_counter()
        ids.append(tok)
        if not args.json:
            out.write(piece)
            out.flush()
    end = time.perf_counter()
    decode_tps = (len(ids) - 1) / (end - first) if first and len(ids) > 1 else 0.0
    if args.json:
        json.dump({"model": model.name, "prompt": args.prompt, "ids": ids, "text": model.detokenize(ids),
                   "seconds": round(end - t0, 4), "decode_tokens_per_second": round(decode_tps, 2)},
                  out, ensure_ascii=False)
    out.write("\n")
    if not args.json and args.stats:
        sys.stderr.write(f"[{len(ids)} tokens, {end - t0:.2f}s, decode {decode_tps:.1f} tok/s]\n")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="generate text from a model (streams tokens as they come); no prompt: a chat")
    run.add_argument("model", help="alias (gemma3-270m, smollm2-135m), a .gguf file, an HF directory, an "
                                    "inference-level vindex, or a Hugging Face Hub id (org/name, hf://org/name@rev)")
    run.add_argument("prompt", nargs="?", help="the text to continue; without it, a chat in the terminal (the model's "
                     "chat template, /reset, /exit)")
    run.add_argument("--max-tokens", type=int, default=32, help="tokens to generate (default 32; in a chat, a reply's)")
    run.add_argument("--top", type=int, default=0, metavar="K", help="print the next-token distribution instead")
    run.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    run.add_argument("--top-k", type=int, default=0, help="sample from the K most likely tokens only (0: all)")
    run.add_argument("--top-p", type=float, default=1.0,
                     help="sample from the smallest set of tokens whose probability reaches P (1: all)")
    run.add_argument("--seed", type=int, default=None, help="the sampler's seed, for a repeatable sample")
    run.add_argument("--stats", action="store_true", help="print token count and speed to stderr")
    run.add_argument("--ffn", action="append", default=None, metavar="URL",
                     help="compute the FFN of the layers (or experts) an FFN server serves there (larql serve "
                          "--ffn-only); repeat it for several servers")
    add_ray_options(run)
    run.set_defaults(func=cmd_run)
