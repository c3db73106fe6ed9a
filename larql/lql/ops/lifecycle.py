"""USE, EXTRACT, STATS, SHOW MODELS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from larql.edit.state.view import edit_vindex
from larql.errors import VindexError
from larql.lql import ast
from larql.lql.ops.sae import detach_all
from larql.lql.plan import PlanRun
from larql.lql.result import Result
from larql.lql.session import Session
from larql.model.hub import local_or_hub
from larql.vindex.extract import extract
from larql.vindex.layout import EXTRACT_DEFAULTS
from larql.vindex.store import open_vindex


def use(stmt: ast.UseStmt, session: Session, result: Result, run: PlanRun) -> None:
    if session.remote is not None:
        session.remote.close()
        session.remote = None
    detach_all(session, result)
    if (step := run.take_if("connect")) is not None:
        from larql.lql.remote import Remote

        session.remote, session.vindex, session.model = Remote(step["target"]), None, None
        result.notes.append(f"Using: {session.describe_backend()}")
        return
    if (step := run.take_if("load_model")) is not None:
        # as the facade's larql.load: USE MODEL also takes a vindex (the model it carries, walk FFN)
        from larql.edit.state.load_any import load_any

        session.model = load_any(step["target"])
        result.notes.append(f"Using model: {session.model!r}")
        return
    target = run.take("open_vindex")["target"]
    path = local_or_hub(target)  # a Hub id names the repository's snapshot in the HF cache
    if path != Path(target).expanduser() and not (path / "index.json").is_file():
        raise VindexError(f"{target} is a model, not a vindex: USE MODEL \"{target}\" runs it, and "
                          f"EXTRACT MODEL \"{target}\" INTO \"name.vindex\" makes a vindex of it")
    session.vindex = edit_vindex(path)
    result.notes.append(f"Using: {session.describe_backend()}")


def _same_extraction(target: Path, src: str | Path, options: dict[str, Any]) -> bool | None:
    """Whether the vindex at `target` was extracted from `src` with `options` (None: no vindex there)."""
    from larql.errors import LarqlError
    from larql.model.load import resolve
    from larql.vindex.integrity import sha256_path

    if not (target / "index.json").is_file():
        return None
    try:
        i = open_vindex(target).index
        _, source = resolve(src)
        return (i["extract_level"], i["dtype"], i["quant"], i["down_top_k"]) == (
            options["level"], options["dtype"], options["quant"], options["top_k"]) \
            and i["source"]["sha256"] == sha256_path(source)[0]
    except LarqlError:  # damaged, or from a source that is gone: not the same
        return False


def extract_vindex(src: str | Path, into: str | Path, *, force: bool = False, progress: Any = None,
                   **options: Any) -> tuple[Path, bool]:
    """Extract `src` into `into`, the one path `larql extract` and EXTRACT MODEL ... INTO share.

    A vindex already at `into` from the same source with the same options is reused (re-running a
    script should not redo a minute of work); `force` extracts again over it, or over any other one.
    Returns (the vindex path, whether it was reused).
    """
    opts = {**EXTRACT_DEFAULTS, **options}
    same = _same_extraction(Path(into), src, opts)
    if same and not force:
        return Path(into), True
    if same is False and not force:
        raise VindexError(f"{into} already holds a different vindex (another source or other options: level, dtype, "
                          f"quant, top-k); choose another path, remove it, or replace it (`larql extract --force`, "
                          f"FORCE in LQL)")
    return extract(src, into, overwrite=force, progress=progress, **opts), False


def extract_stmt(stmt: ast.ExtractStmt, session: Session, result: Result, run: PlanRun) -> None:
    src = run.take("load_model")["model"]  # resolved (and loaded) by the extraction itself
    ex = run.take("extract")
    path, reused = extract_vindex(src, ex["into"], force=run.peek("replace_existing") is not None, level=ex["level"],
                                  progress=session.progress)
    detach_all(session, result)
    session.vindex = edit_vindex(run.take("use")["path"])
    if reused:
        result.notes.append(f"{ex['into']} already holds this model at level {ex['level']}: using it "
                            f"(remove it to extract again)")
    else:
        result.notes.append(f"Extraction complete: {path}")
    result.notes.append(f"Using: {session.describe_backend()}")


def stats(stmt: ast.StatsStmt, session: Session, result: Result, run: PlanRun) -> None:
    path = run.take("read_index")["path"]
    v = open_vindex(path) if path else session.vindex.store if session.vindex else None
    assert v is not None
    i = v.index
    size = sum(e["size"] for e in i["files"].values())
    bands = i["layer_bands"]
    clusters = v.relation_clusters
    n_experts = i["model_config"].get("n_experts", 0)  # a mixture of experts: every expert's features
    experts = f"{n_experts} experts x " if n_experts else ""
    result.columns = ["property", "value"]
    result.rows = [
        ["model", i["model"]], ["family", i["family"]], ["level", i["extract_level"]],
        ["layers", i["num_layers"]], ["features", f"{sum(e['num_features'] for e in i['layers']):,} "
                                                  f"({experts}{i['intermediate_size']} x {i['num_layers']})"],
        ["hidden", i["hidden_size"]], ["vocabulary", f"{i['vocab_size']:,}"], ["dtype", i["dtype"]],
        ["quant", i["quant"]], ["model weights", "yes" if i["has_model_weights"] else "no"],
        ["bands", ", ".join(f"{k} {a}-{b}" for k, (a, b) in bands.items())],
        ["relation clusters", clusters["k"] if clusters else 0], ["down top-k", i["down_top_k"]],
        ["size", f"{size / 1e6:.1f} MB"], ["path", str(v.path)],
    ]
    if "parts" in i:  # a slice: say what it kept
        result.rows.insert(-2, ["parts", ", ".join(i["parts"])])
    result.title = f"STATS {i['model']}"


def show_models(stmt: ast.ShowModelsStmt, session: Session, result: Result, run: PlanRun) -> None:
    result.columns = ["model", "path", "layers", "level", "size_mb"]
    directory = Path(run.take("scan_directory")["directory"])
    for d in sorted(p for p in directory.iterdir() if (p / "index.json").is_file()):
        try:
            v = open_vindex(d)
        except Exception as e:  # a damaged vindex is listed with its problem, not fatal to the listing
            result.rows.append(["?", str(d), "", f"unreadable: {e}", ""])
            continue
        size = sum(e["size"] for e in v.index["files"].values()) / 1e6
        result.rows.append([v.index["model"], str(d), v.num_layers, v.index["extract_level"], size])
    if not result.rows:
        result.notes.append("no vindex directories here")


def diff_stmt(stmt: ast.DiffStmt, session: Session, result: Result, run: PlanRun) -> None:
    from larql.edit.maintain.diff import diff, write_diff_patch

    cmp = run.take("compare_features")
    a = session.vindex if cmp["a"] is None else edit_vindex(cmp["a"])
    b = session.vindex if cmp["b"] is None else edit_vindex(cmp["b"])
    assert a is not None and b is not None  # the planner checked
    layer = cmp["layer"]
    if layer is not None and not 0 <= layer < a.num_layers:
        raise VindexError(f"layer {layer} is out of range: this vindex has layers 0-{a.num_layers - 1}")
    run.take("compare_dense")  # diff() compares the dense tensors too, in the same pass
    report = diff(a, b, layer)
    limit = cmp["limit"]
    a_name, b_name = cmp["a"] or "CURRENT", cmp["b"] or "CURRENT"
    result.title = f"DIFF {a_name} -> {b_name}"
    result.columns = ["layer", "feature", "a", "b", "status", "changed"]
    for r in report.rows[:limit]:
        if r.status in ("dense", "low_rank"):  # a whole tensor: no feature, no tokens
            result.rows.append([r.layer, "", "", "", r.status, r.changed[0]])
        else:
            result.rows.append([r.layer, r.feature, a.token_text(r.a_token), b.token_text(r.b_token), r.status,
                                ", ".join(r.changed)])
    result.notes.append(f"{len(report.rows)} difference(s), {len(result.rows)} shown (limit {limit})")
    if (write := run.take_if("write_patch")) is not None:
        path = write_diff_patch(a, report, write["path"], overwrite=run.peek("replace_existing") is not None)
        result.notes.append(f"wrote {path} ({len(report.ops)} operation(s)): APPLY PATCH on "
                            f"{a_name} gives {b_name}")
