"""Pictures of results with matplotlib (the optional extra `larql[plot]`): a TRACE ... FOR as the
target's rank and probability across layers, a TRACE ... POSITIONS ALL as a logit-lens heatmap
(layer x position, coloured by the top token's probability, labelled with it), and each head's
attention pattern (query x key) at a layer.

    from larql import plot
    from larql.lql.executor import execute
    _, r = execute('USE "g.vindex"; TRACE "The capital of France is" FOR "Paris"')
    fig = plot.trace(r)          # a matplotlib Figure; Jupyter shows it inline
    png = plot.png(fig)          # or as PNG bytes

Figures are built with matplotlib's object API (no pyplot state), so plotting is safe in a server
thread or a test. A result is a Result or the dict `larql lql --json` / `POST /v1/lql` gives.
"""

from __future__ import annotations

import io
import warnings
from typing import TYPE_CHECKING, Any

from larql.errors import LarqlError
from larql.lql.result import Result

if TYPE_CHECKING:
    from larql.model.interp import AttentionPatterns


def _matplotlib() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise LarqlError("larql.plot needs matplotlib, which is not installed; pip install 'larql[plot]' "
                         "(or pip install matplotlib)") from None
    return Figure


def _parts(result: Result | dict[str, Any]) -> tuple[str, list[str], list[list[Any]]]:
    if isinstance(result, Result):
        return result.title or result.statement, result.columns, result.rows
    return str(result.get("title") or result.get("statement", "")), list(result["columns"]), list(result["rows"])


def _need(columns: list[str], names: tuple[str, ...], what: str) -> list[int]:
    missing = [n for n in names if n not in columns]
    if missing:
        raise LarqlError(f"{what} needs a result with the columns {', '.join(names)} (this one has "
                         f"{', '.join(columns) or 'none'}); e.g. {_EXAMPLES[what]}")
    return [columns.index(n) for n in names]


_EXAMPLES = {"plot.trace": 'TRACE "The capital of France is" FOR "Paris"',
             "plot.lens": 'TRACE "The capital of France is" POSITIONS ALL'}


def trace(result: Result | dict[str, Any], figsize: tuple[float, float] = (7.0, 3.5)) -> Any:
    """The target token's rank (log scale, 1 at the top) and probability after the embedding and
    each layer, from a `TRACE ... FOR` result (with POSITIONS ALL: the last position's rows)."""
    Figure = _matplotlib()
    title, columns, rows = _parts(result)
    il, ir, ip = _need(columns, ("layer", "rank", "prob"), "plot.trace")
    if "pos" in columns:  # one trajectory: the last position's (INFER's)
        last = max(r[columns.index("pos")] for r in rows)
        rows = [r for r in rows if r[columns.index("pos")] == last]
    labels = [str(r[il]) for r in rows]
    ranks = [int(r[ir]) for r in rows]  # 1 = the top token
    probs = [float(r[ip]) for r in rows]
    fig = Figure(figsize=figsize, layout="constrained")
    ax = fig.add_subplot()
    x = list(range(len(rows)))
    ax.plot(x, ranks, marker="o", color="tab:blue", label="rank")
    ax.set_yscale("log")
    ax.invert_yaxis()
    ax.set_ylabel("rank (1 = top)", color="tab:blue")
    ax.set_xticks(x, labels)
    ax.set_xlabel("layer")
    ax2 = ax.twinx()
    ax2.plot(x, probs, marker="s", color="tab:orange", label="probability")
    top = max(probs, default=0.0)
    ax2.set_ylim(0, 1.05 if top >= 0.5 else max(top, 1e-6) * 1.1)  # a small probability still shows its shape
    ax2.set_ylabel("probability", color="tab:orange")
    ax.set_title(title, fontsize=10)
    return fig


def lens(result: Result | dict[str, Any], figsize: tuple[float, float] | None = None) -> Any:
    """The logit lens as a heatmap: a row per stage (emb, L0, L1, ...), a column per position,
    coloured by the probability of the top token (or of the FOR target), labelled with the top
    token, from a `TRACE ... POSITIONS ALL` result."""
    Figure = _matplotlib()
    title, columns, rows = _parts(result)
    ipos, il, ip = _need(columns, ("pos", "layer", "prob"), "plot.lens")
    itok = columns.index("top1") if "top1" in columns else None
    positions = sorted({int(r[ipos]) for r in rows})
    stages = list(dict.fromkeys(str(r[il]) for r in rows))
    grid = [[float("nan")] * len(positions) for _ in stages]
    text: dict[tuple[int, int], str] = {}
    for r in rows:
        y, x = stages.index(str(r[il])), positions.index(int(r[ipos]))
        grid[y][x] = float(r[ip])
        if itok is not None:
            text[(y, x)] = str(r[itok])
    fig = Figure(figsize=figsize or (1.2 + 0.9 * len(positions), 1.0 + 0.45 * len(stages)), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(positions)), [str(p) for p in positions])
    ax.set_yticks(range(len(stages)), stages)
    ax.set_xlabel("position")
    ax.set_ylabel("layer")
    for (y, x), tok in text.items():
        ax.text(x, y, repr(tok)[1:-1][:8], ha="center", va="center", fontsize=7,
                color="black" if grid[y][x] > 0.6 else "white")
    fig.colorbar(im, ax=ax, label="probability")
    ax.set_title(title, fontsize=10)
    return fig


def attention(patterns: AttentionPatterns | dict[str, Any], layer: int | None = None,
              heads: list[int] | None = None, figsize: tuple[float, float] | None = None) -> Any:
    """Each head's attention at `layer` (default: the first captured) as a query (row) x key (column)
    heatmap labelled with the tokens, from `larql.model.interp.attention_patterns(...)` or the JSON
    `GET /v1/attention` answers; `heads` picks some (default: all)."""
    import numpy as np

    Figure = _matplotlib()
    if isinstance(patterns, dict):
        tokens, layers, grid = list(patterns["tokens"]), list(patterns["layers"]), np.asarray(patterns["patterns"])
    else:
        tokens, layers, grid = patterns.tokens, patterns.layers, patterns.pattern
    layer = layers[0] if layer is None else layer
    if layer not in layers:
        raise LarqlError(f"plot.attention: layer {layer} is not among the layers captured ({layers})")
    per_head = grid[layers.index(layer)]  # (heads, queries, keys)
    chosen = list(range(per_head.shape[0])) if heads is None else heads
    bad = [h for h in chosen if not 0 <= h < per_head.shape[0]]
    if bad or not chosen:
        raise LarqlError(f"plot.attention: no head {bad[0] if bad else '(none chosen)'} (heads 0..{per_head.shape[0] - 1})")
    cols = min(4, len(chosen))
    rows = (len(chosen) + cols - 1) // cols
    side = 1.2 + 0.3 * len(tokens)
    fig = Figure(figsize=figsize or (side * cols + 1.0, side * rows), layout="constrained")
    labels = [repr(t)[1:-1][:10] for t in tokens]
    im = None
    for k, h in enumerate(chosen):
        ax = fig.add_subplot(rows, cols, k + 1)
        im = ax.imshow(per_head[h], cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(len(tokens)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(tokens)), labels, fontsize=7)
        ax.set_title(f"layer {layer}, head {h}", fontsize=9)
    fig.colorbar(im, ax=fig.axes, label="attention weight (query row, key column)", shrink=0.8)
    return fig


def png(fig: Any, dpi: int = 100) -> bytes:
    """A figure as PNG bytes."""
    buf = io.BytesIO()
    with warnings.catch_warnings():  # a token may be in any script; a glyph the font lacks draws as a box
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
