"""The editing commands of the CLI, thin shells over LQL and larql.edit:

    larql crown SOURCE PROMPT --expect X [--subject S]     CROWN "PROMPT" FOR "X" SUBJECT "S"
    larql edit VINDEX --subject S --relation R --target T [--prompt P] [--method M] [--layer L] [--save P.vlp]
    larql memit VINDEX EDITS.json [--layer L] [--save P.vlp]   one joint MEMIT solve of an edit set
    larql apply-patch VINDEX PATCH.vlp [-o OUT.vindex]      APPLY PATCH (then COMPILE INTO VINDEX OUT)
    larql eval-edits VINDEX EDITS.json [--method M] [--protocols single,stacked] [--held-out TEXT] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from larql.edit.methods.defaults import METHODS, default_method


def _lql(args: argparse.Namespace, text: str) -> int:
    """Run LQL text as `larql lql` would (a table, or JSON lines with --json; progress unless --quiet)."""
    from larql.cli.common import result_printer
    from larql.lql.script import run_text
    from larql.lql.session import Session
    from larql.shell.progress import StatementProgress

    fmt = "json" if args.json else "table"
    sink = result_printer(fmt)
    bars = StatementProgress(enabled=not (args.json or args.quiet))
    run_text(text, Session(source=text, progress=bars.report), sink, around=bars.statement)
    return 0


def _use(source: str) -> str:
    from larql.lql.unparse import q

    return f"USE {q(source)}" if (Path(source) / "index.json").is_file() else f"USE MODEL {q(source)}"


def cmd_crown(args: argparse.Namespace) -> int:
    from larql.lql.unparse import q

    subject = f" SUBJECT {q(args.subject)}" if args.subject else ""
    return _lql(args, f"{_use(args.source)}; CROWN {q(args.prompt)} FOR {q(args.expect)}{subject};")


def cmd_edit(args: argparse.Namespace) -> int:
    from larql.lql.unparse import q

    cols, vals = ["entity", "relation", "target"], [args.subject, args.relation, args.target]
    if args.prompt:
        cols.append("prompt")
        vals.append(args.prompt)
    text = f"{_use(args.vindex)}; "
    text += f"BEGIN PATCH {q(args.save)}; " if args.save else ""
    text += (f"INSERT INTO EDGES ({', '.join(cols)}) VALUES ({', '.join(q(v) for v in vals)})"
             + (f" AT LAYER {args.layer}" if args.layer is not None else "")
             + (f" METHOD {args.method.upper()}" if args.method else "") + ";")  # none: INSERT's, the model's default
    text += " SAVE PATCH;" if args.save else ""
    return _lql(args, text)


def _render(result: Any, as_json: bool) -> None:
    from rich.console import Console

    from larql.shell.render import render, render_json

    if as_json:
        render_json(result, sys.stdout)
    else:
        render(result, Console(file=sys.stdout))


def cmd_memit(args: argparse.Namespace) -> int:
    from larql.edit.insert import insert_facts
    from larql.edit.measure.evaluate import load_edit_set
    from larql.edit.state.view import edit_vindex
    from larql.lql.ops.editing import insert_result
    from larql.lql.result import Result

    records = load_edit_set(args.edits)
    v = edit_vindex(args.vindex)
    if args.save:
        v.patches.begin(args.save, force=True)  # `larql memit --save` replaces the file, as it always did
    report = insert_facts(v, [r.fact() for r in records], "memit", None if args.layer is None else [args.layer])
    result = Result(f"memit {args.edits}")
    insert_result(report, result)
    if args.save:
        patch = v.patches.save()
        result.notes.append(f"saved {patch.path} ({patch.summary()})")
    _render(result, args.json)
    return 0


def cmd_apply_patch(args: argparse.Namespace) -> int:
    from larql.lql.unparse import q

    text = f"USE {q(args.vindex)}; APPLY PATCH {q(args.patch)};"
    text += f" COMPILE CURRENT INTO VINDEX {q(args.output)};" if args.output else " SHOW PATCHES;"
    return _lql(args, text)


def cmd_eval_edits(args: argparse.Namespace) -> int:
    from larql.edit.insert import insert_facts
    from larql.edit.measure.evaluate import EditRecord, evaluate, load_edit_set
    from larql.edit.measure.perplexity import held_out_text
    from larql.edit.state.view import edit_vindex
    from larql.lql.result import Result

    records = load_edit_set(args.edits)
    text = None if args.no_perplexity else held_out_text(args.held_out)
    v = edit_vindex(args.vindex)
    method = args.method or default_method(v.index["model"])

    def apply(batch: Sequence[EditRecord]) -> Callable[[], None]:
        kept = len(v.patches.pending)
        insert_facts(v, [r.fact() for r in batch], method, measure=False)
        return lambda: v.patches.undo(len(v.patches.pending) - kept)

    def say(msg: str) -> None:
        sys.stderr.write(f"  {msg}\n")

    report = evaluate(v.model(), records, apply, args.protocols.split(","), progress=None if args.json else say,
                      held_out=text)
    if args.json:
        json.dump(report.to_json(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    keys = ["S", "ES", "PS", "NS", "RS", "ES_first", "PS_first", "NS_first", "token_acc", "GEN", "gen_ES", "gen_PS",
            "unrelated_top1_kept", "unrelated_kl", "fluency", "perplexity", "perplexity_change"]
    result = Result(f"eval-edits {args.edits}", f"{len(records)} edits by {method}, scored on held-out prompts",
                    ["protocol", *keys])
    for name, row in (("unedited", report.unedited), ("single", report.single), ("stacked", report.stacked),
                      ("sequential", report.sequential)):
        if row is not None:
            result.rows.append([name, *[row.get(k) for k in keys]])
    result.notes.append("ES/PS/NS/RS: whole-target NLL comparisons (x100); *_first: first tokens; unrelated_kl: mean KL")
    result.notes.append("gen_ES/gen_PS: the greedy continuation of the prompt / paraphrases names the new target "
                        "and not the old (x100); perplexity: of the held-out text, perplexity_change in % of the unedited")
    _render(result, False)
    return 0


def add_commands(sub: Any) -> None:
    cr = sub.add_parser("crown", help="which layer's MLP carries a fact (ablation per layer)")
    cr.add_argument("source", help="a vindex (inference level) or a model: alias, .gguf or HF directory")
    cr.add_argument("prompt", help="a prompt the model answers with the fact")
    cr.add_argument("--expect", required=True, help="the token the prompt should produce")
    cr.add_argument("--subject", help="also ablate at the subject's last token (where weight edits key)")
    cr.set_defaults(func=cmd_crown)

    ed = sub.add_parser("edit", help="teach one fact through the vindex's patch overlay (an LQL INSERT)")
    ed.add_argument("vindex", help="a vindex directory (inference level or above) or a model: alias, .gguf or HF directory")
    ed.add_argument("--subject", required=True, help="the entity the fact is about")
    ed.add_argument("--relation", required=True, help="the relation, e.g. capital (it picks the default prompt)")
    ed.add_argument("--target", required=True, help="the new answer")
    ed.add_argument("--prompt", help="the prompt to edit on (must contain the subject; default: the relation's)")
    ed.add_argument("--method", choices=METHODS, default=None,
                    help="the edit method (default: INSERT's, the model's measured default: NEURON on the "
                         "bundled models, ROME elsewhere)")
    ed.add_argument("--layer", type=int, default=None, help="the layer to edit (default: the method's for the model)")
    ed.add_argument("--save", help="write the edit to this .vlp patch")
    ed.set_defaults(func=cmd_edit)

    me = sub.add_parser("memit", help="teach every fact of an edit-set JSON in one joint MEMIT solve")
    me.add_argument("vindex", help="a vindex directory (inference level or above)")
    me.add_argument("edits", help="an edit-set JSON file (vindex_spec/EDITING.md)")
    me.add_argument("--layer", type=int, default=None, help="the layer to edit (default: MEMIT's for the model)")
    me.add_argument("--save", help="write the edit to this .vlp patch")
    me.set_defaults(func=cmd_memit)

    ap = sub.add_parser("apply-patch", help="apply a .vlp patch to a vindex (and compile it into a new one with -o)")
    ap.add_argument("vindex", help="the vindex to patch (never written)")
    ap.add_argument("patch", help="a .vlp patch file")
    ap.add_argument("-o", "--output", help="compile the patched vindex into this new vindex directory")
    ap.set_defaults(func=cmd_apply_patch)

    ev = sub.add_parser("eval-edits", help="score an edit set before and after editing (CounterFact measures)")
    ev.add_argument("vindex", help="a vindex directory (inference level or above)")
    ev.add_argument("edits", help="an edit-set JSON file (vindex_spec/EDITING.md)")
    ev.add_argument("--method", choices=METHODS, default=None,
                    help="the edit method (default: the model's measured default, as INSERT's)")
    ev.add_argument("--protocols", default="single,stacked",
                    help="single, stacked, sequential, or several (comma-separated)")
    ev.add_argument("--held-out", default=None, metavar="TEXT",
                    help="a text file whose perplexity is measured before and after (default: a shipped public-domain passage)")
    ev.add_argument("--no-perplexity", action="store_true", help="skip the held-out perplexity (about a minute each time)")
    ev.set_defaults(func=cmd_eval_edits)
