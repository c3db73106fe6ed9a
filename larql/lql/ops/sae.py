"""USE SAE, SHOW SAES and DROP SAE: the SAEs attached to the session (ops/sae_rows.py reads them
for EXPLAIN INFER and DESCRIBE)."""

from __future__ import annotations

from larql.errors import ModelError
from larql.lql import ast
from larql.lql.ops.inference import model_of
from larql.lql.plan import PlanRun
from larql.lql.result import Result
from larql.lql.session import AttachedSae, Session
from larql.model.hooks import hook_name
from larql.model.sae import check_saes, load_sae
from larql.model.sae_labels import load_feature_labels


def use_sae(stmt: ast.UseSaeStmt, session: Session, result: Result, run: PlanRun) -> None:
    m = model_of(session, stmt)
    load = run.take("load_sae")
    path = load["path"]
    sae = load_sae(path)
    labels = load_feature_labels(load["labels"], sae.d_sae) if load["labels"] is not None else {}
    want = run.take("check_sae")["layer"]
    cfg = m.config
    check_saes([sae], cfg, m.hook_names())  # the hook point exists in this model and has the SAE's width
    layer = hook_name(sae.hook_name, cfg.n_layers, cfg.n_experts).layer
    if want is not None and layer != want:
        where = f"at layer {layer}" if layer is not None else "at no layer"
        raise ModelError(f"{path}: its hook point {sae.hook_name} (cfg.json) is {where}, not layer {want}; drop "
                         f"AT LAYER {want}, or give the SAE trained for layer {want}")
    run.take("attach")
    old = session.saes.get(sae.hook_name)
    session.saes[sae.hook_name] = AttachedSae(sae, path, layer, labels)
    result.notes.append(f"Attached: {sae!r} from {path}" + (f", {len(labels):,} feature labels" if labels else "")
                        + (f' (replaces "{old.path}")' if old is not None else ""))


def show_saes(stmt: ast.ShowSaesStmt, session: Session, result: Result, run: PlanRun) -> None:
    run.take("list_saes")
    result.title = "Attached SAEs"
    result.columns = ["hook", "layer", "architecture", "d_in", "d_sae", "k", "labels", "path"]
    for h, a in session.saes.items():
        s = a.sae
        result.rows.append([h, a.layer, s.architecture, s.d_in, s.d_sae, s.k if s.architecture == "topk" else None,
                            len(a.labels), a.path])
    if not result.rows:
        result.notes.append('(none: USE SAE "dir" attaches one)')


def drop_sae(stmt: ast.DropSaeStmt, session: Session, result: Result, run: PlanRun) -> None:
    hooks = run.take("detach")["hooks"]
    for h in hooks:
        a = session.saes.pop(h, None)
        if a is not None:
            result.notes.append(f'Detached: {h} ("{a.path}")')
    if not result.notes:
        result.notes.append("(no SAE was attached)")


def detach_all(session: Session, result: Result) -> None:
    """USE and EXTRACT point the session at another model: the SAEs checked against the old one go."""
    if session.saes:
        result.notes.append(f"Detached {len(session.saes)} SAE(s): they were checked against the model before")
        session.saes = {}
