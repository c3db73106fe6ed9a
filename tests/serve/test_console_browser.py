"""The console in a real browser: headless Chromium (Debian's, driven by Playwright) against a real
`larql serve` started as a command on a loopback port over the tiny inference vindex. It types
statements, sees the answers, and screenshots the TRACE chart.

As a script it takes the docs' picture (docs/console.png) of a running server:
    python -m tests.serve.test_console_browser http://127.0.0.1:8080 docs/console.png 'TRACE "..." FOR "..."' \
        ["attention prompt" [LAYER]]
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from larql.lql.formats import cell_text

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright (in the dev extra)")
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs a chromium: apt-get install chromium")


@pytest.fixture(scope="module")
def server(infer_vx: Path) -> Iterator[str]:
    """`larql serve` as a user starts it: a process, a free loopback port, the URL read from its line."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "larql", "serve", str(infer_vx), "--port", "0"],
                            stderr=subprocess.PIPE, text=True, env=env, cwd=infer_vx.parent)
    try:
        m = re.search(r"at (http://127\.0\.0\.1:\d+) ", proc.stderr.readline())  # type: ignore[union-attr]
        assert m
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{m.group(1)}/v1/health")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        yield m.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def page(server: str) -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        pg = browser.new_page(viewport={"width": 1000, "height": 900})
        # script errors, console errors (a CSP violation is one) and failed requests, except the
        # 400 the error test asks for (Chromium also logs that one to the console)
        problems: list[str] = []
        pg.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
        pg.on("console", lambda m: problems.append(f"console: {m.text}")
              if m.type == "error" and not m.text.startswith("Failed to load resource") else None)
        pg.on("response", lambda r: problems.append(f"{r.status} {r.url}")
              if r.status >= 400 and not (r.status == 400 and r.url.endswith("/v1/lql")) else None)
        pg.goto(server + "/")
        pg.locator("#info", has_text="layers").wait_for()  # (locators, not wait_for_function: the page's CSP forbids eval)
        pg.problems = problems
        yield pg
        browser.close()


def run(page: Any, text: str) -> None:
    editor = page.locator("#query")
    editor.fill("")
    editor.press_sequentially(text)
    page.keyboard.press("Escape")  # close a completion list typing may have opened
    editor.press("Control+Enter")  # the button is disabled until the answer is on the page
    page.locator("#run[disabled]").wait_for(state="detached", timeout=120_000)


def test_header_names_what_is_served(page: Any) -> None:
    assert page.locator("#info").text_content() == "m.gguf · vindex, inference level · 4 layers · read-only"


def test_a_statement_answers_as_a_table(page: Any) -> None:
    run(page, "SHOW LAYERS")
    table = page.locator("article.result[data-kind=table] table.rows")
    assert table.locator("thead th").all_text_contents() == ["layer", "band", "features", "top_token",
                                                              "top_token_count"]
    assert table.locator("tbody tr td:first-child").all_text_contents() == ["0", "1", "2", "3"]
    assert table.locator("tbody tr:first-child td.num").count() == 3  # numbers right-aligned
    run(page, 'INFER "hello" TOP 3')
    assert page.locator(".result .title").text_content() == "Predictions for 'hello'"
    assert page.locator("table.rows tbody tr").count() == 3


def test_completion_offers_the_grammars_next_keyword(page: Any) -> None:
    editor = page.locator("#query")
    editor.fill("")
    editor.press_sequentially("SHOW LAYERS; DESC")
    page.wait_for_selector("#completions:not([hidden]) li")
    assert page.locator("#completions li .text").all_text_contents() == ["DESCRIBE"]
    editor.press("Tab")
    assert editor.input_value() == "SHOW LAYERS; DESCRIBE "
    editor.fill('TRACE "hello" ')
    editor.press("Tab")  # asked for: everything the grammar accepts here
    page.wait_for_selector("#completions:not([hidden]) li")
    offered = page.locator("#completions li .text").all_text_contents()
    assert {"FOR", "POSITIONS", "DECOMPOSE"} <= set(offered)
    page.keyboard.press("Escape")
    assert page.locator("#completions").is_hidden()


def test_an_error_shows_the_json_errors_message(page: Any, server: str) -> None:
    text = 'SHOW LAYERS 0-0;\nDESCRIBE France'
    err = httpx.post(f"{server}/v1/lql", json={"query": text}).json()["error"]
    run(page, text)
    shown = page.locator("pre.error").text_content()
    assert shown == f"{err['type']}: {err['message']}" and shown.endswith("DESCRIBE France\n           ^")


def test_trace_for_is_a_chart_of_rank_and_probability(page: Any, server: str, tmp_path: Path) -> None:
    text = 'TRACE "hello" FOR "x"'
    rows = httpx.post(f"{server}/v1/lql", json={"query": text}, timeout=120).json()["results"][0]["rows"]
    run(page, text)
    chart = page.locator("article[data-kind=trace] svg.trace-chart")
    assert chart.locator("circle.rank-point").count() == len(rows) == 5  # emb, L0..L3
    assert chart.locator("circle.prob-point").count() == 5
    assert [len(chart.locator(f"polyline.{c}").get_attribute("points").split()) for c in ("rank", "prob")] == [5, 5]
    # the rank axis is log scale with rank 1 at the top: a better rank is drawn higher
    ys = [float(y) for y in chart.locator("circle.rank-point").evaluate_all("cs => cs.map(c => c.getAttribute('cy'))")]
    ranks = [r[1] for r in rows]
    assert all((ys[i] < ys[j]) == (ranks[i] < ranks[j]) for i in range(5) for j in range(5) if ranks[i] != ranks[j])
    png = chart.screenshot()
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    assert img.shape[0] > 150 and img.shape[1] > 400
    blue = ((img[..., 2] > 180) & (img[..., 0] < 90)).sum()  # the rank line (#2563eb)
    orange = ((img[..., 0] > 200) & (img[..., 1] > 60) & (img[..., 1] < 130) & (img[..., 2] < 60)).sum()  # #ea580c
    assert blue > 300 and orange > 300, (blue, orange)  # both lines drawn, not a blank box
    assert len({tuple(p) for p in img.reshape(-1, 3)[::7]}) > 20
    # the rows under the chart show each value as the terminal table does (larql/lql/formats.py cell_text)
    from larql.lql.formats import cell_text

    cells = page.locator("article[data-kind=trace] details table.rows tbody td").all_text_contents()
    assert cells == [cell_text(v) for row in rows for v in row]


def test_logit_lens_is_a_heatmap(page: Any) -> None:
    run(page, 'TRACE "hello" POSITIONS ALL')
    chart = page.locator("article[data-kind=lens] svg.lens-chart")
    assert chart.locator("rect.cell").count() == 5 * 5  # 5 positions x (emb, L0..L3)
    assert chart.locator("text.cell-label").count() == 25
    assert page.locator("article[data-kind=lens] details summary").text_content() == "25 rows"


def test_attention_is_a_heatmap_per_head(page: Any, server: str) -> None:
    want = httpx.get(f"{server}/v1/attention", params={"prompt": "hello there", "layer": 2}, timeout=120).json()
    heads, tokens = want["patterns"][0], want["tokens"]
    n = len(tokens)
    assert page.locator("#attn-layer option").all_text_contents() == ["0", "1", "2", "3"]
    page.locator("#attn-prompt").fill("hello there")
    page.locator("#attn-layer").select_option("2")  # a prompt already typed: choosing a layer shows it
    card = page.locator("article[data-kind=attention]")
    card.wait_for(timeout=120_000)
    assert card.locator(".title").text_content() == f'Attention at layer 2 for "hello there" ({n} tokens, {len(heads)} heads)'
    charts = card.locator("svg.attn-chart")
    assert charts.count() == len(heads) >= 2
    for h in range(len(heads)):
        chart = card.locator(f"svg.attn-chart[data-head='{h}']")
        assert chart.get_attribute("data-layer") == "2"
        assert chart.locator("rect.cell").count() == n * n
        # each cell's tooltip carries the weight the API sent for (query, key), as tables show numbers
        titles = chart.locator("rect.cell title").all_text_contents()
        assert titles == [f"query {q} {json.dumps(tokens[q], ensure_ascii=False)} → key {k} {json.dumps(tokens[k], ensure_ascii=False)}: "
                          f"{cell_text(heads[h][q][k])}" for q in range(n) for k in range(n)]
        fills = chart.locator("rect.cell").evaluate_all("cs => cs.map(c => c.getAttribute('fill'))")
        above = [fills[q * n + k] for q in range(n) for k in range(n) if k > q]
        assert set(above) == {"rgb(68,1,84)"}  # a query never attends to a later key: weight 0, the colour map's 0
        assert fills[0] == "rgb(253,231,37)"  # the first query attends only to itself: weight 1
    assert card.locator("svg.attn-chart text.attn-label").count() == 2 * n * len(heads)  # queries and keys labelled
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(charts.first.screenshot())).convert("RGB")).astype(int)
    assert len({tuple(p) for p in img.reshape(-1, 3)[::3]}) > 10  # drawn, not a blank box
    page.locator("#attn-layer").select_option("0")  # another layer: fetched and drawn again
    page.locator("svg.attn-chart[data-layer='0']").first.wait_for(timeout=120_000)
    assert page.locator("svg.attn-chart").count() == len(heads)


def test_describe_is_a_card_and_text_stays_text(page: Any, browse: str) -> None:
    page.goto(browse + "/")  # the browse-level server: DESCRIBE without the model
    page.locator("#info", has_text="layers").wait_for()
    run(page, 'DESCRIBE "<b>x</b>"; WALK "<i>hi</i>" TOP 1 LAYERS 0-0')
    card = page.locator("article[data-kind=describe] .describe")
    assert card.locator("h2").text_content() == "<b>x</b>"  # the entity as text, not markup
    assert page.locator("#output b, #output i, #output script").count() == 0
    assert page.locator("article[data-kind=table] .title").text_content().startswith("Feature scan for '<i>hi</i>'")


def test_no_script_or_console_errors(page: Any) -> None:
    assert page.problems == [], page.problems


def screenshot(url: str, out: str, text: str, attn_prompt: str | None = None, attn_layer: str = "0") -> None:
    """Open the console at `url`, run `text` (and, given a prompt, show the attention panel's heads at
    `attn_layer`) and save the page as a PNG."""
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        pg = browser.new_page(viewport={"width": 900, "height": 600})
        pg.goto(url + "/")
        pg.locator("#info", has_text="layers").wait_for()
        run(pg, text)
        if attn_prompt:
            pg.locator("#attn-prompt").fill(attn_prompt)
            pg.locator("#attn-layer").select_option(attn_layer)
            pg.locator(f"svg.attn-chart[data-layer='{attn_layer}']").first.wait_for(timeout=120_000)
        pg.screenshot(path=out, full_page=True)
        browser.close()


if __name__ == "__main__":
    screenshot(*sys.argv[1:6])
