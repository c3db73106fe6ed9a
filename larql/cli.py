"""The `larql` command line. Every LarqlError becomes one line on stderr and exit code 1;
tracebacks appear only with --debug."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from larql.cli_core import add_global_options, preflight
from larql.errors import LarqlError

T = TypeVar("T")


def _threads(n: int | None) -> None:
    """Thread pools for numba, OpenMP and BLAS (main() has set them before numpy loaded; this
    resizes numba's pool when a command is called in-process after it started)."""
    from larql.threads import configure

    configure(n)


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
            from larql.serve.ffn_remote import use_remote_ffn
        except ImportError as e:
            raise LarqlError(f"--ffn needs {e.name}: pip install 'larql[serve]'") from e
        for url in args.ffn:  # shards compose: each takes its layers (or experts) from the model before it
            model = use_remote_ffn(model, url)
    out = sys.stdout
    if args.prompt is None:
        from larql.cli_chat import run_chat

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


def run_with_progress(args: argparse.Namespace, work: Callable[[Callable[[str, int, int], None]], T],
                      label: str = "") -> tuple[T, Any, float]:
    """Run `work(report)` under one transient progress display on stderr (none with --quiet or
    --json, or when stderr is not a terminal); returns its result, the stderr console and the
    seconds taken. Threads were set by main() before numpy loaded."""
    from rich.console import Console

    from larql.shell.progress import StatementProgress

    console = Console(stderr=True)
    t0 = time.perf_counter()
    bars = StatementProgress(console, enabled=not (args.quiet or args.json))
    with bars.statement(label or args.command):
        out = work(bars.report)
    return out, console, time.perf_counter() - t0


def cmd_extract(args: argparse.Namespace) -> int:
    from larql.lql.ops.lifecycle import extract_vindex

    (path, reused), console, seconds = run_with_progress(args, lambda report: extract_vindex(
        args.src, args.output, level=args.level, dtype=args.dtype, quant=args.quant, top_k=args.top_k,
        force=args.force, progress=report), f"extract {args.src}")
    size = sum(f.stat().st_size for f in path.iterdir())
    if args.json:
        print(json.dumps({"path": str(path), "level": args.level, "bytes": size, "seconds": round(seconds, 2),
                          "reused": reused}))
    elif reused:
        console.print(f"{path} already holds this extraction ({size / 1e6:.1f} MB, level {args.level}): kept it "
                      f"(--force extracts again)", markup=False, highlight=False)
    else:
        console.print(f"wrote {path} ({size / 1e6:.1f} MB, level {args.level}) in {seconds:.1f}s",
                      markup=False, highlight=False)
    counts = json.loads((path / "index.json").read_text()).get("requantized")
    if counts and not args.json and not reused:
        console.print(f"--quant q4k: {counts['Q4_K']} matrices now Q4_K, {counts['Q6_K']} Q6_K; "
                      f"{counts['kept']} kept their encoding (see FORMAT.md for which and why)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from larql.vindex.verify import repair, verify_vindex

    report = verify_vindex(args.path)
    problems = [f"{name} (contents differ from its sha256)" for name in report.bad_files] + report.config_diffs
    repaired = repair(args.path) if problems and args.repair else None
    if args.json:
        print(json.dumps({"path": str(args.path), "ok": report.ok, "files": report.files, "problems": problems,
                          "repaired": None if repaired is None else str(repaired)}))
    elif report.ok:
        print(f"{args.path}: ok ({report.files} files match index.json; {report.source_note})")
    elif repaired is not None:
        print(f"{args.path}: repaired ({'; '.join(problems)}): re-extracted into {repaired}")
    else:
        sys.stderr.write(f"larql: error: {args.path}: {'; '.join(problems)}; repair with larql verify --repair "
                         f"{args.path}, or re-extract it\n")
    return 0 if report.ok or repaired is not None else 1


def cmd_lql(args: argparse.Namespace) -> int:
    from rich.console import Console

    from larql.lql.parser import parse
    from larql.lql.planner import plan
    from larql.lql.session import Session
    from larql.lql.unparse import unparse
    from larql.shell.progress import StatementProgress
    from larql.shell.render import render_as

    fmt = args.format or ("json" if args.json else "table")
    if args.json and fmt != "json":
        sys.stderr.write(f"larql: error: --json and --format {fmt} ask for different outputs; give one\n")
        return 2
    if (args.file is None) == (args.statements is None):
        sys.stderr.write("larql: error: give LQL statements or -f FILE (one of them)\n")
        return 2
    if args.file is not None:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except OSError as e:
            sys.stderr.write(f"larql: error: {args.file}: cannot read ({e.strerror})\n")
            return 1
    else:
        text = args.statements
    plain = fmt != "table"  # machine-readable: no colour, no progress bars
    console = Console(file=sys.stdout, width=args.width, no_color=plain)
    bars = StatementProgress(enabled=not (plain or args.quiet or args.plan))
    session = Session(source=text, progress=bars.report)
    if args.vindex:
        from larql.edit.view import edit_vindex

        session.vindex = edit_vindex(args.vindex)
    first = True  # nothing written yet (csv / markdown separate results with a blank line)
    for stmt in parse(text):
        if args.plan:
            print(plan(stmt, session).to_text())
            continue
        from larql.lql.executor import (
            run_statement,  # the runtime (numba) loads only to run, not to plan
        )

        with bars.statement(unparse(stmt)):  # erased before the results print
            results = run_statement(stmt, session)
        for result in results:
            if render_as(fmt, result, console, sys.stdout, first=first, timing=args.timing):
                first = False
    return 0


def cmd_repl(args: argparse.Namespace) -> int:
    from larql.shell.repl import run_repl

    return run_repl(args.vindex, json_output=args.json)


def build_parser() -> argparse.ArgumentParser:
    # shared with EXTRACT MODEL ... INTO; layout loads no numpy, so `larql --help` stays fast
    from larql.vindex.layout import EXTRACT_DEFAULTS, LEVELS

    parser = argparse.ArgumentParser(prog="larql", description="A language model as a database.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="generate text from a model (streams tokens as they come); no prompt: a chat")
    run.add_argument("model", help="alias (gemma3-270m, smollm2-135m), a .gguf file or an HF directory")
    run.add_argument("prompt", nargs="?", help="the text to continue; without it, a chat in the terminal (the model's "
                     "chat template, /reset, /exit)")
    run.add_argument("--max-tokens", type=int, default=32, help="tokens to generate (default 32; in a chat, a reply's)")
    run.add_argument("--top", type=int, default=0, metavar="K", help="print the next-token distribution instead")
    run.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    run.add_argument("--top-k", type=int, default=0)
    run.add_argument("--top-p", type=float, default=1.0)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--stats", action="store_true", help="print token count and speed to stderr")
    run.add_argument("--ffn", action="append", default=None, metavar="URL",
                     help="compute the FFN of the layers (or experts) an FFN server serves there (larql serve "
                          "--ffn-only); repeat it for several servers")
    run.set_defaults(func=cmd_run)

    ex = sub.add_parser("extract", help="decompile a model into a vindex directory")
    ex.add_argument("src", help="alias, .gguf file or HF directory")
    ex.add_argument("-o", "--output", required=True, help="the vindex directory to create (e.g. g.vindex)")
    ex.add_argument("--level", choices=LEVELS, default=EXTRACT_DEFAULTS["level"],
                    help="browse: no model weights; inference/all: the vindex runs the model (LQL: WITH INFERENCE)")
    ex.add_argument("--dtype", choices=["f16", "f32"], default=EXTRACT_DEFAULTS["dtype"],
                    help="embeddings and gate vectors")
    ex.add_argument("--quant", choices=["source", "q4k"], default=EXTRACT_DEFAULTS["quant"],
                    help="model weights: keep the source encoding (default) or requantize")
    ex.add_argument("--top-k", type=int, default=EXTRACT_DEFAULTS["top_k"],
                    help="output tokens kept per feature (default 10)")
    ex.add_argument("--force", action="store_true",
                    help="extract again over a vindex at the output (without it, the same extraction is reused and a different one refused)")
    ex.set_defaults(func=cmd_extract)

    lq = sub.add_parser("lql", help="run LQL statements: larql lql 'USE \"g.vindex\"; DESCRIBE \"France\";'")
    lq.add_argument("statements", nargs="?", help="one or more statements separated by ';'")
    lq.add_argument("-f", "--file", help="read the statements from a file")
    lq.add_argument("--vindex", help="USE this vindex before the statements")
    lq.add_argument("--plan", action="store_true", help="print each statement's plan instead of running it")
    lq.add_argument("--timing", action="store_true", help="print each statement's time")
    lq.add_argument("--width", type=int, default=None, help="table width (default: the terminal's)")
    lq.add_argument("--format", choices=["table", "json", "csv", "markdown"], default=None,
                    help="table (default), json (one object a result, as --json), csv (header and rows of each "
                         "result, values in full), markdown (title, pipe table, notes)")
    lq.set_defaults(func=cmd_lql)

    rp = sub.add_parser("repl", help="an interactive LQL shell (statements end with ';', .help for commands)")
    rp.add_argument("vindex", nargs="?", help="a vindex to USE at start")
    rp.set_defaults(func=cmd_repl)

    ve = sub.add_parser("verify", help="check a vindex: index.json's seal and consistency, every file's sha256, "
                                       "model_config against the source model")
    ve.add_argument("path")
    ve.add_argument("--repair", action="store_true", help="re-extract a damaged vindex from its (unchanged) source")
    ve.set_defaults(func=cmd_verify)

    from larql import cli_bench, cli_build, cli_db, cli_edit

    cli_edit.add_commands(sub)
    cli_db.add_commands(sub)
    cli_build.add_commands(sub)
    cli_bench.add_commands(sub)
    from larql.serve.cli import add_command as add_serve

    add_serve(sub)
    add_global_options(parser, sub)
    return parser


def _validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if getattr(args, "max_tokens", 1) < 1:
        parser.error("--max-tokens must be at least 1")
    if getattr(args, "top", 0) < 0:
        parser.error("--top must be positive")
    if not 0.0 < getattr(args, "top_p", 1.0) <= 1.0:
        parser.error("--top-p must be in (0, 1]")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (cli_core lists them)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    answered = preflight(argv, list(sub.choices))
    if answered is not None:
        return answered
    args = parser.parse_args(argv)
    _validate(args, parser)
    try:
        _threads(args.threads)  # before numpy and numba load: their pools read the environment once
    except ValueError as e:
        parser.error(str(e))
    try:
        return int(args.func(args))
    except LarqlError as e:
        if args.debug:
            raise
        from larql.errors import LqlError

        sys.stderr.write(f"larql: {type(e).__name__}: " if isinstance(e, LqlError) else "larql: error: ")
        sys.stderr.write(f"{e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
