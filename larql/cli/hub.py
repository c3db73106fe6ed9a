"""Vindexes through the Hugging Face Hub (larql/vindex/sharing.py):

    larql pull REPO [--slice all|browse|inference|client|server] [--revision R] [-o DIR] [--force]
    larql publish VINDEX REPO [--slice PRESET] [--revision R] [--private] [--dry-run]

pull prints the vindex's path on stdout (a summary on stderr), so `larql repl "$(larql pull org/x)"`
works; publish prints its plan, one line per file, and uploads only the adds and changes.
"""

from __future__ import annotations

import argparse
import json
import sys


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} KB"


def cmd_pull(args: argparse.Namespace) -> int:
    from huggingface_hub.utils import disable_progress_bars

    from larql.vindex.sharing import pull

    if args.quiet or args.json or not sys.stderr.isatty():  # huggingface_hub's own download bars
        disable_progress_bars()
    got = pull(args.repo, preset=args.slice, revision=args.revision, out=args.output, overwrite=args.force)
    if args.json:
        print(json.dumps({"path": str(got.path), "repo": got.repo, "commit": got.commit, "files": got.files,
                          "bytes": got.size, "how": got.how}))
        return 0
    how = {"cache": "in the Hugging Face cache", "copied": "copied out of the Hugging Face cache",
           "cut": f"the {args.slice} slice, cut from the files pulled into the Hugging Face cache"}[got.how]
    if not args.quiet:
        sys.stderr.write(f"pulled {got.repo}@{got.commit[:12]}: {got.files} files, {_mb(got.size)}; {how}\n")
    print(got.path)
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from larql.vindex.sharing import plan_upload, repo_ref, staged, upload

    repo, rev = repo_ref(args.repo, args.revision)
    with staged(args.vindex, repo, args.slice) as local:
        plan = plan_upload(local, repo, rev)
        up = sum(s.size for s in plan.uploads)
        kept = [s for s in plan.steps if s.action == "unchanged"]
        gone = [s for s in plan.steps if s.action == "delete"]
        if args.json and args.dry_run:
            print(json.dumps({"repo": repo, "revision": rev, "checked": plan.checked,
                              "why_unchecked": plan.why_unchecked or None,
                              "files": [{"name": s.name, "action": s.action, "bytes": s.size} for s in plan.steps]}))
            return 0
        if not args.json:
            for s in plan.steps:
                print(f"{s.action:<10} {s.name:<26} {_mb(s.size):>10}")
            where = f"{repo}@{rev}" if rev else repo
            summary = f"{where}: {len(plan.uploads)} files to upload ({_mb(up)}), {len(kept)} unchanged"
            summary += f", {len(gone)} to delete" if gone else ""
            if not plan.checked:
                summary += f"; the repository was not checked ({plan.why_unchecked}), so every file counts as an add"
            elif not plan.exists:
                summary += "; a new repository" + (" (private)" if args.private else "")
            print(summary + ("; --dry-run: nothing uploaded" if args.dry_run else ""))
        if args.dry_run:
            return 0
        url = upload(plan, local, private=args.private,
                     message=f"larql publish {args.vindex}" + (f" --slice {args.slice}" if args.slice else ""))
    if args.json:
        print(json.dumps({"repo": repo, "revision": rev, "uploaded": [s.name for s in plan.uploads],
                          "deleted": [s.name for s in gone], "commit": url}))
    else:
        print(f"published {repo}: {url}" if url else f"{repo} already holds this vindex: nothing uploaded")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    from larql.vindex.slice import PRESETS, PULL_SLICES

    pl = sub.add_parser("pull", help="download a vindex (or a slice of it) from the Hugging Face Hub")
    pl.add_argument("repo", help="org/name or hf://org/name[@revision]")
    pl.add_argument("--slice", choices=PULL_SLICES, default=None,
                    help="only what this slice needs (all: the whole repository, the default); a slice the "
                         "repository does not hold as it is is cut into a new vindex (-o, else ./NAME-SLICE.vindex)")
    pl.add_argument("--revision", help="a branch, tag or commit (as @rev in the id)")
    pl.add_argument("-o", "--output", default=None,
                    help="put the vindex here (default: the Hugging Face cache's snapshot, HF_HOME)")
    pl.add_argument("--force", action="store_true", help="replace an existing output")
    pl.set_defaults(func=cmd_pull)

    pb = sub.add_parser("publish", help="upload a vindex (or a slice of it) and a model card to the Hugging Face Hub, "
                                        "only the files the repository does not already have")
    pb.add_argument("vindex", help="the vindex directory to upload")
    pb.add_argument("repo", help="org/name or hf://org/name[@revision]")
    pb.add_argument("--slice", choices=list(PRESETS), default=None, help="publish this slice of the vindex")
    pb.add_argument("--revision", help="the branch to commit to (default main)")
    pb.add_argument("--private", action="store_true", help="create the repository private (when it does not exist)")
    pb.add_argument("--dry-run", action="store_true",
                    help="print each file's action (add / change / unchanged / delete) and size; upload nothing")
    pb.set_defaults(func=cmd_publish)
