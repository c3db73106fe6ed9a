"""A result in Jupyter (HTML, escaped), as a pandas DataFrame, as CSV and Markdown, and as pictures
(larql.plot to PNG) — from real statements on the tiny inference vindex."""

from __future__ import annotations

import csv
import io
import json
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from larql import plot
from larql.errors import LarqlError
from larql.lql.executor import execute
from larql.lql.formats import cell_text, to_csv, to_markdown
from larql.lql.result import Result
from larql.shell.render import render, render_json


class _Cells(HTMLParser):
    """The text of every <th>/<td>, and every tag seen (to prove data did not become markup)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self.tags: list[str] = []
        self._in = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag in ("td", "th"):
            self._in, self.cells = True, self.cells + [""]

    def handle_endtag(self, tag: str) -> None:
        self._in = self._in and tag not in ("td", "th")

    def handle_data(self, data: str) -> None:
        if self._in:
            self.cells[-1] += data


HOSTILE = Result('INFER "x"', title="Predictions for '<b>x</b>'", columns=["rank", "token", "prob"],
                 rows=[[1, "</s>", 0.123456789], [2, "<script>alert(1)</script>", 2.5e-05], [3, "a|b\nc", 12345.678]],
                 notes=["a note with <i>markup</i> & an ampersand"])


def test_html_is_a_table_with_every_text_escaped() -> None:
    page = HOSTILE._repr_html_()
    p = _Cells()
    p.feed(page)
    assert set(p.tags) == {"div", "strong", "table", "thead", "tr", "th", "tbody", "td", "p", "small"}
    assert p.cells == ["rank", "token", "prob", "1", "</s>", "0.1235", "2", "<script>alert(1)</script>", "2.5e-05",
                       "3", "a|b\nc", "12345.7"]
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "&lt;i&gt;markup&lt;/i&gt; &amp; an ampersand" in page
    assert 'style="text-align:right"' in page  # numbers right-aligned, as in the terminal


def test_csv_keeps_values_whole_and_markdown_escapes_cells() -> None:
    rows = list(csv.reader(io.StringIO(to_csv(HOSTILE))))
    assert rows[0] == ["rank", "token", "prob"] and rows[1] == ["1", "</s>", "0.123456789"]
    assert rows[3] == ["3", "a|b\nc", "12345.678"]  # quoted by csv, not rounded
    assert to_csv(Result("USE x", notes=["Using: x"])) == ""
    md = to_markdown(HOSTILE).splitlines()
    assert md[0] == "**Predictions for '&lt;b&gt;x&lt;/b&gt;'**"
    assert md[2:4] == ["| rank | token | prob |", "|---:|---|---:|"]
    assert md[6] == "| 3 | a\\|b\\nc | 12345.7 |" and md[-1] == "- a note with &lt;i&gt;markup&lt;/i&gt; &amp; an ampersand"


@pytest.fixture(scope="module")
def traced(vxi: Path) -> dict[str, Result]:
    _, r_for, r_lens, r_infer = execute(f'USE "{vxi}"; TRACE "hello" FOR "x"; TRACE "hello" POSITIONS ALL; '
                                        f'INFER "hello" TOP 3')
    return {"for": r_for, "lens": r_lens, "infer": r_infer}


def test_to_pandas_has_the_rows_unrounded(traced: dict[str, Result]) -> None:
    import pandas as pd

    r = traced["infer"]
    df = r.to_pandas()
    assert isinstance(df, pd.DataFrame) and list(df.columns) == r.columns
    assert df.values.tolist() == r.rows and df["rank"].tolist() == [1, 2, 3]


def test_a_tiny_probability_reaches_json_whole_and_reads_in_the_table(traced: dict[str, Result]) -> None:
    """Handlers do not round: a probability below 5e-5 (once stored as 0.0) is in the JSON as it was
    computed, and the table shows it to 4 significant digits (5.77e-08), never as 0."""
    trace, infer = traced["for"], traced["infer"]
    probs = [row[trace.columns.index("prob")] for row in trace.rows] + [infer.rows[1][2]]
    assert all(isinstance(p, float) and 0.0 < p < 5e-5 for p in probs), probs  # the tiny model's "x", its 2nd guess
    for r in (trace, infer):
        buf = io.StringIO()
        render_json(r, buf)
        back = json.loads(buf.getvalue())
        assert back["rows"] == r.rows and back["elapsed_ms"] == r.elapsed_ms  # every float, bit for bit
    console = Console(record=True, width=160, color_system=None)
    render(trace, console)
    render(infer, console)
    table = console.export_text()
    for p in probs:
        shown = cell_text(p)
        assert "e-" in shown and float(shown) == pytest.approx(p, rel=5e-4) and f" {shown} " in table
    assert cell_text(3.2e-06) == "3.2e-06" and cell_text(0.1234567) == "0.1235" and cell_text(0.0) == "0"


def test_to_pandas_without_pandas_names_the_install(traced: dict[str, Result],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # what an environment without pandas looks like to import
    with pytest.raises(LarqlError, match=r"needs pandas, which is not installed; pip install pandas"):
        traced["infer"].to_pandas()


def _pixels(png: bytes) -> np.ndarray:
    from matplotlib.image import imread

    return imread(io.BytesIO(png))


def test_plot_trace_and_lens_render_to_png(traced: dict[str, Result]) -> None:
    for fig, n_lines in ((plot.trace(traced["for"]), 2), (plot.lens(traced["lens"]), 0)):
        png = plot.png(fig)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        img = _pixels(png)
        assert img.shape[0] > 200 and img.shape[1] > 300
        assert img[..., :3].std() > 0.05  # not blank: axes, lines, cells
        if n_lines:  # rank and probability, one point per stage (emb, L0..L3)
            lines = [ln for ax in fig.axes for ln in ax.get_lines()]
            assert len(lines) == n_lines and all(len(ln.get_xdata()) == 5 for ln in lines)
            assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["emb", "L0", "L1", "L2", "L3"]
    heat = plot.lens(traced["lens"]).axes[0].get_images()[0].get_array()
    assert heat.shape == (5, len({r[0] for r in traced["lens"].rows})) and float(heat.max()) <= 1.0
    # the dict a server answers plots the same
    assert len(plot.trace(traced["for"].to_json()).axes[0].get_lines()[0].get_xdata()) == 5


def test_plot_names_the_statement_it_needs(traced: dict[str, Result]) -> None:
    with pytest.raises(LarqlError, match=r'plot.lens needs a result with the columns pos, layer, prob .*'
                                         r'POSITIONS ALL'):
        plot.lens(traced["infer"])
    with pytest.raises(LarqlError, match=r"plot.trace needs .* FOR"):
        plot.trace(traced["lens"])


def test_plot_attention_draws_a_heatmap_per_head(vxi: Path) -> None:
    import larql
    from larql.model.interp import attention_patterns

    m = larql.load(vxi)
    att = attention_patterns(m, m.tokenize("hello there"))
    fig = plot.attention(att, layer=2)
    images = [ax.get_images()[0].get_array() for ax in fig.axes if ax.get_images()]
    assert len(images) == m.config.n_heads
    assert all(np.array_equal(np.asarray(img), att.layer(2)[h]) for h, img in enumerate(images))  # unrounded
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [repr(t)[1:-1][:10] for t in att.tokens]
    assert _pixels(plot.png(fig))[..., :3].std() > 0.05
    as_json = {"tokens": att.tokens, "layers": att.layers, "patterns": att.pattern.tolist()}
    assert len([ax for ax in plot.attention(as_json, layer=1, heads=[0]).axes if ax.get_images()]) == 1
    with pytest.raises(LarqlError, match="no head 9"):
        plot.attention(att, heads=[9])
    with pytest.raises(LarqlError, match="layer 7 is not among"):
        plot.attention(att, layer=7)
