"""INFER and TRACE: the real forward pass (from the vindex's weights or USE MODEL), explained."""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.errors import LqlSemanticError
from larql.lql import ast
from larql.lql.ops.sae_rows import attached, explain_features
from larql.lql.plan import PlanRun
from larql.lql.result import Result
from larql.lql.session import Session
from larql.model.generate import log_softmax
from larql.model.interp import (
    kl,
    layer_deltas,
    logit_attribution,
    logit_lens,
    rank_of,
    residual_hook_names,
    top_tokens,
)
from larql.model.targets import first_target_token


def model_of(session: Session, stmt: ast.Statement) -> Any:
    if session.model is not None:
        return session.model
    v = session.vindex
    if v is None or not v.has_model_weights:
        raise LqlSemanticError("this statement needs model weights, and the vindex in use is browse-level",
                               session.source, stmt.span.line, stmt.span.column,
                               'extract WITH INFERENCE, or USE MODEL "gemma3-270m"')
    return v.model()


def infer(stmt: ast.InferStmt, session: Session, result: Result, run: PlanRun) -> None:
    m = model_of(session, stmt)
    prompt = run.take("tokenize")["prompt"]
    ids = m.tokenize(prompt)
    steer = run.take_if("steer")
    forward = m.dense() if run.take("forward")["ffn"] == "dense" else m  # the dense FFN ignores the overlay
    if steer is not None:  # an attached SAE's feature added at its hook point
        hooks = session.saes[steer["hook"]].sae.steer(steer["feature"], steer["scale"])
        logits = forward.next_logits(ids, hooks=hooks)
        result.notes.append(f"steered: {steer['scale']:+g} x feature {steer['feature']} of {steer['hook']}")
    # a server runs INFER through its batcher: one forward pass with other clients' INFERs
    elif session.next_logits is not None:
        logits = session.next_logits(forward, ids)
    else:
        logits = forward.next_logits(ids)
    top_n = run.take("top_k")["k"]
    logp = log_softmax(logits)
    top = top_tokens(logits, top_n)
    text = m.tokenizer.token_text
    result.title = f"Predictions for {prompt!r}"
    if run.take_if("compare_dense") is None:
        result.columns = ["rank", "token", "prob", "logit"]
        result.rows = [[r + 1, text(int(t)), float(np.exp(logp[t])), float(logits[t])]
                       for r, t in enumerate(top)]
        return
    edits = m.edits
    if edits is None:
        result.notes.append("USE MODEL runs the dense FFN: there is no vindex walk to compare, both columns are dense")
    dense_logits = m.dense().next_logits(ids)
    dense_logp = log_softmax(dense_logits)
    dense_top = top_tokens(dense_logits, top_n)
    result.columns = ["rank", "walk token", "walk prob", "dense token", "dense prob"]
    result.rows = [[r + 1, text(int(t)), float(np.exp(logp[t])), text(int(d)), float(np.exp(dense_logp[d]))]
                   for r, (t, d) in enumerate(zip(top, dense_top))]
    n_edited = len(edits) if isinstance(edits, Sized) else 0
    result.notes.append(f"walk FFN over {n_edited} edited feature(s) vs dense FFN: top-1 "
                        f"{'agrees' if top[0] == dense_top[0] else 'differs'}, "
                        f"KL(dense || walk) = {kl(dense_logp, logp):.4g}, "
                        f"max |logit difference| = {float(np.max(np.abs(logits - dense_logits))):.4g}")


def trace(stmt: ast.TraceStmt, session: Session, result: Result, run: PlanRun) -> None:
    m = model_of(session, stmt)
    prompt = run.take("tokenize")["prompt"]
    if run.take_if("capture_trace") is not None:
        from larql.model.trace_file import capture_trace, save_trace

        trace = capture_trace(m, prompt)
        path = run.take("write_trace")["path"]
        save_trace(trace, path, overwrite=run.peek("replace_existing") is not None)
        result.notes.append(f"Saved {len(trace.token_ids)} token chains x {trace.n_layers + 1} stages to {path} "
                            f"(load with larql.model.trace_file.load_trace)")
    cfg = m.config
    ids = m.tokenize(prompt)
    span = run.take("run_with_cache")["layers"]
    if span is not None and span[1] >= cfg.n_layers:
        raise LqlSemanticError(f"layer {span[1]} is out of range (layers 0-{cfg.n_layers - 1})",
                               session.source, stmt.span.line, stmt.span.column)
    _, cache = m.run_with_cache(ids, names=["hook_embed"] + residual_hook_names(range(cfg.n_layers)))
    layers = range(cfg.n_layers) if span is None else range(span[0], span[1] + 1)
    attribute = run.take_if("attribute")
    target = first_target_token(m, attribute["token"]) if attribute is not None else None
    lens = run.take("logit_lens")
    all_positions, decompose = lens["positions"] == "all", lens["decompose"]
    positions = list(range(len(ids))) if all_positions else [len(ids) - 1]

    rows: list[list[Any]] = []
    totals: list[float] = []
    for pos in positions:
        tag = [pos] if all_positions else []
        stages: list[tuple[str, NDArray[np.float32], NDArray[np.float32] | None, NDArray[np.float32] | None]]
        stages = [("emb", cache["hook_embed"][pos], None, None)]
        for layer in layers:
            stages.append((f"L{layer}", cache[f"blocks.{layer}.hook_resid_post"][pos], *layer_deltas(cache, layer, pos)))
        if target is not None:  # each write read through the final norm onto the target's logit
            emb_term, parts = logit_attribution(m, cache, target, pos)
            running = emb_term + np.concatenate([[0.0], np.cumsum(parts.sum(axis=1))])  # after emb, L0, L1, ...
            totals.append(float(running[-1]))
        for label, resid, attn, ffn in stages:
            logp = logit_lens(m, resid)
            if target is not None:
                layer = -1 if attn is None else int(label[1:])
                a, f = (None, None) if attn is None else (float(parts[layer, 0]), float(parts[layer, 1]))
                who = "" if a is None or f is None else ("attn" if abs(a) > abs(f) else "ffn")
                rows.append(tag + [label, rank_of(logp, target), float(np.exp(logp[target])),
                                   "" if a is None else a, "" if f is None else f,
                                   float(running[layer + 1]), who])
            elif decompose:
                if attn is None or ffn is None:  # the embedding row (both or neither are None)
                    continue
                na, nf = float(np.linalg.norm(attn)), float(np.linalg.norm(ffn))
                rows.append(tag + [label, na, nf, float(np.linalg.norm(resid)),
                                   f"{100 * na / (na + nf):.0f}%"])
            else:
                top = int(np.argmax(logp))
                rows.append(tag + [label, m.tokenizer.token_text(top), float(np.exp(logp[top])),
                                   "" if attn is None else float(np.linalg.norm(attn)),
                                   "" if ffn is None else float(np.linalg.norm(ffn))])
    pos_col = ["pos"] if all_positions else []
    if target is not None:
        result.title = f"TRACE {prompt!r} FOR {m.tokenizer.token_text(target)!r}"
        result.columns = pos_col + ["layer", "rank", "prob", "attn_logit", "ffn_logit", "logit_so_far", "who"]
        result.notes.append(f"attn_logit / ffn_logit: each layer's write read through the final norm onto "
                            f"{m.tokenizer.token_text(target)!r}; the embedding and every layer's terms add up to "
                            f"the logit, {totals[-1]:.4f} at the last position (INFER's)"
                            + (f", before the final softcap of {cfg.final_softcap:g}" if cfg.final_softcap else ""))
    elif decompose:
        result.title = f"TRACE {prompt!r} DECOMPOSE"
        result.columns = pos_col + ["layer", "|attn_delta|", "|ffn_delta|", "|residual|", "attn%"]
    else:
        result.title = f"TRACE {prompt!r}"
        result.columns = pos_col + ["layer", "top1", "prob", "|attn_delta|", "|ffn_delta|"]
    result.rows = rows
    result.notes.append("logit lens: final norm + unembedding of the residual after each layer")


def explain_infer(stmt: ast.ExplainInferStmt, session: Session, result: Result, run: PlanRun) -> None:
    """Per layer, the FFN features that fired hardest at the last position (|act(gate) * up|), what
    they write (down_meta, when a vindex is in use), and WITH ATTENTION the most-attended prompt
    tokens and the logit-lens top-1."""
    m = model_of(session, stmt)
    cfg = m.config
    if cfg.n_experts:
        raise LqlSemanticError(f"EXPLAIN INFER ranks one FFN's activations (mlp.hook_post); {cfg.arch}'s layers are "
                               f"a mixture of {cfg.n_experts} experts, which has none", session.source,
                               stmt.span.line, stmt.span.column, f'TRACE "{stmt.prompt}" shows the layers\' writes')
    v = session.vindex
    prompt = run.take("tokenize")["prompt"]
    ids = m.tokenize(prompt)
    planned = run.take("run_with_cache")["layers"]
    layers = list(range(cfg.n_layers)) if planned is None else list(planned)
    feats = run.take("top_features")
    with_attention = run.take_if("attention_and_lens") is not None
    sae_step = run.take_if("sae_features")
    saes = attached(session, sae_step)
    added = {i: more for i in layers if m.edits is not None and (more := m.edits.added(i)) is not None}
    names = [f"blocks.{i}.mlp.hook_post" for i in layers] + [f"blocks.{i}.hook_resid_mid" for i in added]
    if with_attention:
        names += [f"blocks.{i}.{k}" for i in layers for k in ("attn.hook_pattern", "hook_resid_post")]
    names += [f"{a.sae.hook_name}.hook_sae_acts_post" for a in saes]
    # the SAEs are read with their error term added back: the logits are the model's own
    logits, cache = m.run_with_cache(ids, names=names, saes=[a.sae for a in saes], use_error_term=True)
    logp = log_softmax(logits[-1])
    best = int(np.argmax(logp))
    per_layer = feats["k"]
    result.title = (f"Inference trace for {prompt!r}: prediction {m.tokenizer.token_text(best)!r} "
                    f"({100 * float(np.exp(logp[best])):.1f}%)")
    result.columns = ["layer", "feature", "activation", "top", "down", "relation"]
    if with_attention:
        result.columns += ["attends_to", "lens_top1"]
    token_texts = [m.tokenizer.token_text(t) for t in ids]
    sae_rows = explain_features(m, saes, cache, sae_step) if sae_step is not None else {}
    blank = ["", ""] if with_attention else []
    for layer in layers:
        act = cache[f"blocks.{layer}.mlp.hook_post"][-1]  # (ffn,)
        feature_ids = np.arange(len(act))
        if layer in added:  # features METHOD NEURON added: the hook has the model's own; these follow, by id
            more = added_activations(m, layer, added[layer], cache[f"blocks.{layer}.hook_resid_mid"][-1])
            ids_added = list(v.overlay.added(layer)) if v is not None else range(len(act), len(act) + len(more))
            act, feature_ids = np.concatenate([act, more]), np.concatenate([feature_ids, np.asarray(ids_added)])
        order = np.argsort(-np.abs(act), kind="stable")
        extra: list[Any] = []
        if with_attention:
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"][-1].mean(axis=0)  # (S,) averaged over heads
            attended = ", ".join(f"{token_texts[j]!r}:{pattern[j]:.2f}" for j in np.argsort(-pattern)[:3])
            lens = lens_top1(m, cache[f"blocks.{layer}.hook_resid_post"][-1])
            extra = [attended, lens]
        shown = 0
        for i in order:
            f = int(feature_ids[i])
            label = v.feature_label(layer, f) if v is not None else None
            if feats["relations_only"] and not label:
                continue
            if v is not None:
                meta = v.feature_meta(layer, f)
                top, down = meta.tokens[0].strip(), ", ".join(t.strip() for t in meta.tokens[1:1 + feats["n_down"]])
            else:
                top, down = "", ""
            result.rows.append([layer, f, float(act[i]), top, down, label or ""] + extra)
            extra = ["", ""] if with_attention else []
            shown += 1
            if shown >= per_layer:
                break
        for f, act, top, more, label in sae_rows.pop(layer, []):  # SAE features after the layer's neurons
            result.rows.append([layer, f"SAE {f}", act, top, more, label] + blank)
    for f, act, top, more, label in (r for rows in sae_rows.values() for r in rows):  # SAEs at no layer
        result.rows.append(["", f"SAE {f}", act, top, more, label] + blank)
    if saes:
        result.notes.append("SAE rows: features of the attached SAEs (" + ", ".join(a.sae.hook_name for a in saes)
                            + ") at the last position; top / down: the tokens the decoder row writes")


def added_activations(m: Any, layer: int, added: tuple[np.ndarray, np.ndarray, np.ndarray],
                      resid_mid: np.ndarray) -> np.ndarray:
    """act(gate) * up of a layer's added features `(n,)` at one position, from the residual before its MLP."""
    from larql.model.ffn import gated
    from larql.model.forward import norm

    x = norm(m.config, resid_mid[None, :], m.weights.layers[layer].ffn_norm)  # (1, hidden) the MLP's input
    g_add, u_add, _ = added
    return np.asarray(gated(m.config.activation, x @ g_add.T, x @ u_add.T)[0])  # (n,)


def lens_top1(m: Any, resid: np.ndarray) -> str:
    logp = logit_lens(m, resid)
    top = int(np.argmax(logp))
    return f"{m.tokenizer.token_text(top)!r} {np.exp(logp[top]):.2f}"


def crown(stmt: ast.CrownStmt, session: Session, result: Result, run: PlanRun) -> None:
    from larql.model.crown import find_crown

    m = model_of(session, stmt)
    prompt = run.take("tokenize")["prompt"]
    expected = run.take("baseline")["expected"]
    sites = [run.take("ablate_mlp_out")["site"]]
    subject = None
    if (at_subject := run.take_if("ablate_mlp_out")) is not None:  # find_crown ablates both sites in one pass
        sites.append(at_subject["site"])
        subject = at_subject["subject"]
    r = find_crown(m, prompt, expected, subject)
    run.take("crown")
    crowns = {site: r.crown(site).layer for site in sites}
    result.title = (f"Crown of {r.token.strip()!r} after {prompt!r}: MLP outputs zeroed one layer at a time "
                    f"(p {r.p_base:.3g}, rank {r.rank_base} intact)")
    result.columns = ["layer"] + [c for site in sites for c in (f"p ({site})", f"change ({site})", f"flips ({site})")]
    for layer in sorted({x.layer for x in r.layers}):
        row: list[Any] = [layer]
        for site in sites:
            x = next(x for x in r.layers if x.layer == layer and x.site == site)
            row += [x.p, x.delta(r.p_base), ("yes" if x.flipped else "") + (" <- crown" if crowns[site] == layer else "")]
        result.rows.append(row)
    result.notes.append(f"crown at the last position: L{crowns['last']}"
                        + (f"; at the subject's last token ({subject!r}, where weight edits key): "
                           f"L{crowns['subject']}" if subject else ""))
