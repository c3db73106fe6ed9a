"""USE SAE, SHOW SAES and DROP SAE: the SAEs attached to the session; FEATURES: their features
position by position; SAE FEATURE: where one feature fires most in a corpus (ops/sae_rows.py makes the rows, EXPLAIN INFER's and DESCRIBE's too)."""

from __future__ import annotations

from larql.edit.methods.stats import corpus_chunks
from larql.errors import ModelError
from larql.lql import ast
from larql.lql.ops.inference import model_of
from larql.lql.ops.sae_rows import attached, feature_rows
from larql.lql.plan import PlanRun
from larql.lql.result import Result
from larql.lql.session import AttachedSae, Session
from larql.model.hooks import hook_name
from larql.model.interp import feature_examples, feature_top_tokens, sae_activations, top_features
from larql.model.sae import check_saes
from larql.model.sae_labels import load_feature_labels
from larql.model.sae_load import load_sae
from larql.model.transcoder import Transcoder, check_transcoders, mlp_layer


def use_sae(stmt: ast.UseSaeStmt, session: Session, result: Result, run: PlanRun) -> None:
    m = model_of(session, stmt)
    load = run.take("load_sae")
    path = load["path"]
    sae = load_sae(path)
    labels = load_feature_labels(load["labels"], sae.d_sae) if load["labels"] is not None else {}
    want = run.take("check_sae")["layer"]
    cfg = m.config
    if isinstance(sae, Transcoder):  # it replaces a layer's MLP of this model's width
        check_transcoders([sae], cfg)
        layer: int | None = mlp_layer(sae)
    else:  # the hook point exists in this model and has the SAE's width
        check_saes([sae], cfg, m.hook_names())
        layer = hook_name(sae.hook_name, cfg.n_layers, cfg.n_experts).layer
    clash = [h for h, a in session.saes.items() if isinstance(sae, Transcoder) and h != sae.hook_name
             and isinstance(a.sae, Transcoder) and a.layer == layer]
    if clash:
        raise ModelError(f"{path}: a transcoder for layer {layer}'s MLP is attached already ({clash[0]}); "
                         f"DROP SAE \"{clash[0]}\" first")
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
    result.columns = ["hook", "kind", "writes", "layer", "architecture", "d_in", "d_sae", "k", "labels", "path"]
    for h, a in session.saes.items():
        s = a.sae
        writes = s.hook_name_out if isinstance(s, Transcoder) else h
        result.rows.append([h, s.kind, writes, a.layer, s.architecture, s.d_in, s.d_sae,
                            s.k if s.architecture == "topk" else None, len(a.labels), a.path])
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


def sae_features(stmt: ast.SaeFeaturesStmt, session: Session, result: Result, run: PlanRun) -> None:
    m = model_of(session, stmt)
    prompt = run.take("tokenize")["prompt"]
    ids = m.tokenize(prompt)
    step = run.take("sae_features")
    read = attached(session, step)
    _, acts = sae_activations(m, ids, [a.sae for a in read])
    text = m.tokenizer.token_text
    positions = range(len(ids)) if step["positions"] == "all" else [len(ids) - 1]
    result.title = f"SAE features of {prompt!r}"
    result.columns = ["position", "token", "layer", "feature", "activation", "top", "down", "label"]
    for a in read:
        for p in positions:
            found = top_features(m, a.sae, acts[a.sae.hook_name][p], step["k"], p, step["n_tokens"])
            for f, act, top, more, label in feature_rows(m, a, found):
                result.rows.append([p, text(ids[p]), a.layer, f, act, top, more, label])
    if len(read) > 1:
        result.notes.append("SAEs in the order attached: " + ", ".join(a.sae.hook_name for a in read))


def sae_feature(stmt: ast.SaeFeatureStmt, session: Session, result: Result, run: PlanRun) -> None:
    m = model_of(session, stmt)
    chunks = corpus_chunks(m, run.take("read_corpus")["tokens"])
    step = run.take("feature_examples")
    a = session.saes[step["hook"]]
    feature = step["feature"]
    examples = feature_examples(m, a.sae, feature, chunks, step["k"])
    result.title = f"Where feature {feature} of {a.sae.hook_name} fires most"
    result.columns = ["rank", "activation", "token", "context"]
    result.rows = [[i + 1, e.activation, e.token, f"{e.before}[{e.token}]".replace("\n", "\\n")]
                   for i, e in enumerate(examples)]
    label = a.labels.get(feature)
    if label:
        result.notes.append(f"label: {label}")
    if a.sae.d_out == m.config.hidden:
        writes = feature_top_tokens(m, a.sae, feature, step["n_tokens"])
        result.notes.append("writes: " + ", ".join(repr(m.detokenize([t])) for t, _ in writes))
    total = sum(len(c) for c in chunks)
    result.notes.append(f"read over {total:,} tokens of larql's statistics corpus"
                        + ("" if examples else "; the feature never fired there"))


def detach_all(session: Session, result: Result) -> None:
    """USE and EXTRACT point the session at another model: the SAEs checked against the old one go."""
    if session.saes:
        result.notes.append(f"Detached {len(session.saes)} SAE(s): they were checked against the model before")
        session.saes = {}
