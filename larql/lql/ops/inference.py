"""INFER and TRACE: the real forward pass (from the vindex's weights or USE MODEL), explained."""

from __future__ import annotations

from typing import Any

import numpy as np

from larql.errors import LqlSemanticError
from larql.lql import ast
from larql.lql.result import Result
from larql.lql.session import Session
from larql.model.forward import rms_norm
from larql.model.generate import log_softmax


def model_of(session: Session, stmt: ast.Statement) -> Any:
    if session.model is not None:
        return session.model
    v = session.vindex
    if v is None or not v.has_model_weights:
        raise LqlSemanticError("this statement needs model weights, and the vindex in use is browse-level",
                               session.source, stmt.span.line, stmt.span.column,
                               'extract WITH INFERENCE, or USE MODEL "gemma3-270m"')
    return v.model()


def infer(stmt: ast.InferStmt, session: Session, result: Result) -> None:
    m = model_of(session, stmt)
    ids = m.tokenize(stmt.prompt)
    logits = m.next_logits(ids)
    logp = log_softmax(logits)
    top = np.argsort(-logits, kind="stable")[: stmt.top or 5]
    result.title = f"Predictions for {stmt.prompt!r}"
    result.columns = ["rank", "token", "prob", "logit"]
    result.rows = [[r + 1, m.tokenizer.token_text(int(t)), round(float(np.exp(logp[t])), 4), round(float(logits[t]), 3)]
                   for r, t in enumerate(top)]
    if stmt.compare:
        result.notes.append("walk FFN and dense FFN agree exactly while no patch is applied (no patches yet)")


def _target_id(m: Any, token: str) -> int:
    """LARQL's rule: the first sub-token of " " + target (unless it already starts with a space)."""
    text = token if token.startswith(" ") else " " + token
    ids = [i for i in m.tokenizer.tok.encode(text, add_special_tokens=False).ids]
    return int(ids[0])


def trace(stmt: ast.TraceStmt, session: Session, result: Result) -> None:
    if stmt.save is not None:
        raise LqlSemanticError("TRACE ... SAVE is not implemented yet", session.source, stmt.span.line,
                               stmt.span.column, "drop SAVE; the trace file format arrives with the inference issue")
    m = model_of(session, stmt)
    cfg, w = m.config, m.weights
    ids = m.tokenize(stmt.prompt)
    names = ["hook_embed"] + [f"blocks.{i}.{k}" for i in range(cfg.n_layers)
                              for k in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")]
    _, cache = m.run_with_cache(ids, names=names)
    positions = list(range(len(ids))) if stmt.positions == "all" else [len(ids) - 1]
    layers = range(cfg.n_layers) if stmt.layers is None else range(stmt.layers.start, stmt.layers.end + 1)
    if stmt.layers is not None and stmt.layers.end >= cfg.n_layers:
        raise LqlSemanticError(f"layer {stmt.layers.end} is out of range (layers 0-{cfg.n_layers - 1})",
                               session.source, stmt.span.line, stmt.span.column)
    target = _target_id(m, stmt.for_token) if stmt.for_token is not None else None
    unembed_row = w.output.row(target) if target is not None else None

    def lens(x: np.ndarray) -> np.ndarray:  # logit lens: final norm, then unembedding
        return log_softmax(w.output.matmul(rms_norm(x, w.output_norm, cfg.norm_eps)))

    rows: list[list[Any]] = []
    for pos in positions:
        tag = [pos] if stmt.positions == "all" else []
        stages = [("emb", cache["hook_embed"][pos], None, None)]
        for layer in layers:
            pre = cache[f"blocks.{layer}.hook_resid_pre"][pos]
            mid = cache[f"blocks.{layer}.hook_resid_mid"][pos]
            post = cache[f"blocks.{layer}.hook_resid_post"][pos]
            stages.append((f"L{layer}", post, mid - pre, post - mid))
        for label, resid, attn, ffn in stages:
            logp = lens(resid)
            if target is not None:
                rank = int((logp > logp[target]).sum()) + 1
                a = float(unembed_row @ attn) if attn is not None else 0.0
                f = float(unembed_row @ ffn) if ffn is not None else 0.0
                who = "" if attn is None else ("attn" if abs(a) > abs(f) else "ffn")
                rows.append(tag + [label, rank, round(float(np.exp(logp[target])), 4), round(a, 3), round(f, 3), who])
            elif stmt.decompose:
                if attn is None:
                    continue
                na, nf = float(np.linalg.norm(attn)), float(np.linalg.norm(ffn))
                rows.append(tag + [label, round(na, 2), round(nf, 2), round(float(np.linalg.norm(resid)), 2),
                                   f"{100 * na / (na + nf):.0f}%"])
            else:
                top = int(np.argmax(logp))
                na = "" if attn is None else round(float(np.linalg.norm(attn)), 2)
                nf = "" if ffn is None else round(float(np.linalg.norm(ffn)), 2)
                rows.append(tag + [label, m.tokenizer.token_text(top), round(float(np.exp(logp[top])), 4), na, nf])
    pos_col = ["pos"] if stmt.positions == "all" else []
    if target is not None:
        result.title = f"TRACE {stmt.prompt!r} FOR {m.tokenizer.token_text(target)!r}"
        result.columns = pos_col + ["layer", "rank", "prob", "attn_logit", "ffn_logit", "who"]
    elif stmt.decompose:
        result.title = f"TRACE {stmt.prompt!r} DECOMPOSE"
        result.columns = pos_col + ["layer", "|attn_delta|", "|ffn_delta|", "|residual|", "attn%"]
    else:
        result.title = f"TRACE {stmt.prompt!r}"
        result.columns = pos_col + ["layer", "top1", "prob", "|attn_delta|", "|ffn_delta|"]
    result.rows = rows
    result.notes.append("logit lens: final norm + unembedding of the residual after each layer")
