"""The plans of USE SAE, SHOW SAES, DROP SAE, FEATURES and SAE FEATURE, and the SAE steps EXPLAIN INFER, DESCRIBE
and INFER ... STEER add when SAEs are attached (an attached SAE is read beside the model: the
model's outputs stay its own, unless INFER steers by one of its features)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from larql.errors import LqlSemanticError
from larql.lql import ast
from larql.lql.plan import Step

if TYPE_CHECKING:
    from larql.lql.session import AttachedSae, Session

# what EXPLAIN INFER and DESCRIBE show of each attached SAE without TOP: features, tokens per feature
SAE_DEFAULTS = {"explain_infer_features": 5, "describe_features": 5, "features_per_position": 3,
                "feature_tokens": 3, "feature_examples": 10, "corpus_tokens": 2048}


def use_sae_steps(stmt: ast.UseSaeStmt, session: Session) -> list[Step]:
    check = "hook point and width against the model" + (f", hook point at layer {stmt.layer}"
                                                         if stmt.layer is not None else "")
    labels = f"; feature labels from {stmt.labels}" if stmt.labels is not None else ""
    return [Step("load_sae", stmt.path + labels, {"path": stmt.path, "labels": stmt.labels}),
            Step("check_sae", check, {"layer": stmt.layer}),
            Step("attach", "read beside the model (error term added back: its outputs unchanged); "
                           "replaces an SAE at the same hook point")]


def sae_features_steps(stmt: ast.SaeFeaturesStmt, session: Session) -> list[Step]:
    read = saes_in(session, [stmt.layer] if stmt.layer is not None else None)
    if not read:
        where = f"at layer {stmt.layer}" if stmt.layer is not None else "attached"
        raise LqlSemanticError(f"FEATURES reads the attached SAEs, and none is {where}", session.source,
                               stmt.span.line, stmt.span.column,
                               'USE SAE "dir" attaches one; SHOW SAES lists them' if session.saes else
                               'USE SAE "dir" attaches one')
    k = stmt.top or SAE_DEFAULTS["features_per_position"]
    positions = stmt.positions or "all"
    hooks = tuple(a.sae.hook_name for a in read)
    return [Step("tokenize", repr(stmt.prompt), {"prompt": stmt.prompt}),
            Step("sae_features", f"{', '.join(hooks)} (error term added back): top {k} features at "
                                 f"{'each position' if positions == 'all' else 'the last position'}, each with the "
                                 f"{SAE_DEFAULTS['feature_tokens']} tokens its decoder row writes",
                 {"hooks": hooks, "k": k, "n_tokens": SAE_DEFAULTS["feature_tokens"], "positions": positions})]


def show_saes_steps(stmt: ast.ShowSaesStmt, session: Session) -> list[Step]:
    return [Step("list_saes", f"{len(session.saes)} attached")]


def drop_sae_steps(stmt: ast.DropSaeStmt, session: Session) -> list[Step]:
    if stmt.target is None:
        return [Step("detach", "every SAE", {"hooks": tuple(session.saes)})]
    hook = find_sae(session, stmt.target)
    if hook is None:
        attached = ", ".join(f'"{a.path}" ({h})' for h, a in session.saes.items()) or "none"
        raise LqlSemanticError(f'no SAE "{stmt.target}" is attached (attached: {attached})', session.source,
                               stmt.span.line, stmt.span.column, "name it by its USE SAE path or its hook point; "
                                                                 "SHOW SAES lists them")
    return [Step("detach", hook, {"hooks": (hook,)})]


def steer_step(stmt: ast.InferStmt, session: Session) -> list[Step]:
    """INFER ... STEER's step: which attached SAE's feature is added, and how much (no STEER: no step)."""
    steer = stmt.steer
    if steer is None:
        return []

    def error(message: str, hint: str) -> LqlSemanticError:
        return LqlSemanticError(message, session.source, stmt.span.line, stmt.span.column, hint)

    if stmt.compare:
        raise error("INFER ... STEER takes no COMPARE: COMPARE sets the walk FFN against the dense one",
                    "run the two apart")
    hook = pick_sae(session, steer.sae, steer.feature, "STEER",
                    lambda h: f'INFER "..." STEER "{h}" FEATURE {steer.feature} BY {steer.scale:g}', error)
    return [Step("steer", f"{steer.scale:+g} x feature {steer.feature}'s decoder row at {hook}, every position",
                 {"hook": hook, "feature": steer.feature, "scale": steer.scale})]


def pick_sae(session: Session, name: str | None, feature: int, what: str, example: Callable[[str], str],
             error: Callable[[str, str], LqlSemanticError]) -> str:
    """The hook of the attached SAE a statement's feature belongs to: the one `name` names (its USE SAE
    path or hook point), or the only one attached; `error(message, hint)` for none, several, or a
    feature out of its range; `example(hook)`: the statement spelled with an SAE named."""
    named = ", ".join(f'"{h}"' for h in session.saes)
    if name is not None:
        hook = find_sae(session, name)
        if hook is None:
            raise error(f'no SAE "{name}" is attached (attached: {named or "none"})',
                        "name it by its USE SAE path or its hook point; SHOW SAES lists them")
    elif len(session.saes) == 1:
        hook = next(iter(session.saes))
    else:
        raise error(f"{what} needs an attached SAE: USE SAE \"dir\" first" if not session.saes else
                    f"{what}: several SAEs are attached ({named}); name the one to read",
                    "e.g. " + example(next(iter(session.saes), "blocks.6.hook_resid_post")))
    d_sae = session.saes[hook].sae.d_sae
    if feature >= d_sae:
        raise error(f"feature {feature} is out of range: the SAE at {hook} has features 0-{d_sae - 1}",
                    "SHOW SAES lists each SAE's d_sae")
    return hook


def sae_feature_steps(stmt: ast.SaeFeatureStmt, session: Session) -> list[Step]:
    """SAE FEATURE's plan: the SAE read over larql's statistics corpus, the contexts where the feature
    fires most."""
    def error(message: str, hint: str) -> LqlSemanticError:
        return LqlSemanticError(message, session.source, stmt.span.line, stmt.span.column, hint)

    hook = pick_sae(session, stmt.sae, stmt.feature, "SAE FEATURE",
                    lambda h: f'SAE "{h}" FEATURE {stmt.feature}', error)
    k = stmt.top or SAE_DEFAULTS["feature_examples"]
    return [Step("read_corpus", f"{SAE_DEFAULTS['corpus_tokens']} tokens of larql's statistics corpus",
                 {"tokens": SAE_DEFAULTS["corpus_tokens"]}),
            Step("feature_examples", f"{hook} (error term added back): feature {stmt.feature}'s {k} strongest "
                                     f"activations, each in its context; its label and the "
                                     f"{SAE_DEFAULTS['feature_tokens']} tokens it writes",
                 {"hook": hook, "feature": stmt.feature, "k": k, "n_tokens": SAE_DEFAULTS["feature_tokens"]})]


def find_sae(session: Session, target: str) -> str | None:
    """The hook name of the attached SAE `target` names: its path as USE SAE wrote it, or its hook point."""
    if target in session.saes:
        return target
    return next((h for h, a in session.saes.items() if a.path == target), None)


def saes_in(session: Session, layers: list[int] | None) -> list[AttachedSae]:
    """The attached SAEs whose hook point is in `layers` (None: every layer, and the global hook points)."""
    return [a for a in session.saes.values() if layers is None or (a.layer is not None and a.layer in layers)]


def explain_sae_step(session: Session, layers: list[int] | None, k: int | None) -> list[Step]:
    """EXPLAIN INFER's step for the attached SAEs at the layers it reads (none attached: no step)."""
    read = saes_in(session, layers)
    if not read:
        return []
    k = k or SAE_DEFAULTS["explain_infer_features"]
    hooks = tuple(a.sae.hook_name for a in read)
    return [Step("sae_features", f"{', '.join(hooks)}: top {k} SAE features at the last position, each with the "
                                 f"{SAE_DEFAULTS['feature_tokens']} tokens its decoder row writes",
                 {"hooks": hooks, "k": k, "n_tokens": SAE_DEFAULTS["feature_tokens"]})]


def describe_sae_step(session: Session, layers: list[int] | None) -> list[Step]:
    """DESCRIBE's step for the attached SAEs (none attached: no step)."""
    read = saes_in(session, layers)
    if not read:
        return []
    k = SAE_DEFAULTS["describe_features"]
    hooks = tuple(a.sae.hook_name for a in read)
    return [Step("sae_features", f"{', '.join(hooks)}: top {k} SAE features by their largest activation on the "
                                 f"entity's tokens, each with the {SAE_DEFAULTS['feature_tokens']} tokens it writes",
                 {"hooks": hooks, "k": k, "n_tokens": SAE_DEFAULTS["feature_tokens"]})]
