// The larql console: an LQL editor with the grammar's completion, and each result as a table, a
// DESCRIBE card, a TRACE ... FOR chart (rank and probability across layers) or a logit-lens heatmap
// (TRACE ... POSITIONS ALL); and each head's attention pattern for a prompt (/v1/attention) as a
// query x key heatmap per head, a layer at a time. It talks to this server's /v1 API only; every text from the server is
// put into the page as text (textContent / text nodes), never as markup.
"use strict";

(() => {
  const $ = (sel) => document.querySelector(sel);
  const query = $("#query"), output = $("#output"), list = $("#completions");
  const runButton = $("#run"), statusLine = $("#status");
  const SVG_NS = "http://www.w3.org/2000/svg";

  // ---- small DOM helpers ------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    e.append(...children.filter((c) => c !== null && c !== undefined));
    return e;
  }

  function svg(tag, attrs, ...children) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    e.append(...children);
    return e;
  }

  // what a cell shows, as larql/lql/formats.py cell_text: 4 significant digits ("%.4g"), one decimal past 10,000
  function cellText(v) {
    if (typeof v !== "number" || Number.isInteger(v)) return String(v);
    if (Math.abs(v) >= 1e4) return v.toFixed(1);
    const [mant, exp] = v.toExponential(3).split("e");
    const e = Number(exp);
    const strip = (s) => (s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s);
    if (e < -4 || e >= 4) return `${strip(mant)}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
    return strip(v.toPrecision(4));
  }

  const isNumber = (v) => typeof v === "number";

  // ---- results ----------------------------------------------------------------------------------

  function table(r) {
    const numeric = r.columns.map((_, i) => r.rows.length > 0 && r.rows.every((row) => isNumber(row[i])));
    const head = el("tr", {}, ...r.columns.map((c, i) => el("th", numeric[i] ? { class: "num" } : {}, c)));
    const body = r.rows.map((row) =>
      el("tr", {}, ...row.map((v, i) => el("td", numeric[i] ? { class: "num" } : {}, cellText(v)))));
    return el("table", { class: "rows" }, el("thead", {}, head), el("tbody", {}, ...body));
  }

  function col(r, name) { return r.columns.indexOf(name); }

  function describeCard(r) {
    const [iSec, iRel, iTgt, iScore, iLayers] = ["section", "relation", "target", "score", "layers"].map((c) => col(r, c));
    const card = el("div", { class: "describe" }, el("h2", {}, r.title));
    if (r.rows.length === 0) card.append(el("p", { class: "empty" }, "no edges"));
    const sections = new Map();
    for (const row of r.rows) {
      const key = iSec >= 0 ? String(row[iSec]) : "";
      if (!sections.has(key)) sections.set(key, []);
      sections.get(key).push(row);
    }
    for (const [section, rows] of sections) {
      if (section) card.append(el("h3", {}, section));
      card.append(el("ul", {}, ...rows.map((row) => el("li", {},
        el("span", { class: "relation" }, iRel >= 0 ? String(row[iRel]) : ""),
        el("span", { class: "target" }, iTgt >= 0 ? String(row[iTgt]) : ""),
        iScore >= 0 ? el("span", { class: "score" }, cellText(row[iScore])) : null,
        iLayers >= 0 ? el("span", { class: "layers" }, String(row[iLayers])) : null))));
    }
    return card;
  }

  // TRACE ... FOR: the target's rank (log scale, 1 at the top) and probability after each stage
  function traceChart(r) {
    const iPos = col(r, "pos"), iLayer = col(r, "layer"), iRank = col(r, "rank"), iProb = col(r, "prob");
    let rows = r.rows;
    if (iPos >= 0) { // one trajectory: the last position's, INFER's
      const last = Math.max(...rows.map((row) => row[iPos]));
      rows = rows.filter((row) => row[iPos] === last);
    }
    const W = 640, H = 276, L = 56, R = 56, T = 34, B = 40;
    const n = rows.length, pw = W - L - R, ph = H - T - B;
    const x = (i) => L + (n === 1 ? pw / 2 : (i * pw) / (n - 1));
    const maxRank = Math.max(2, ...rows.map((row) => row[iRank]));
    const logMax = Math.log10(maxRank);
    const yRank = (v) => T + (Math.log10(Math.max(1, v)) / logMax) * ph; // rank 1 at the top
    const maxProb = Math.max(...rows.map((row) => row[iProb]));
    const probTop = maxProb >= 0.5 ? 1 : Math.max(maxProb * 1.1, 1e-6); // a small probability still shows its shape
    const yProb = (v) => T + ph - (v / probTop) * ph;

    const chart = svg("svg", { class: "chart trace-chart", viewBox: `0 0 ${W} ${H}`, width: W, height: H,
      role: "img", "aria-label": `rank and probability of the target across ${n} stages` });
    const grid = svg("g", { class: "axis" });
    for (let k = 0; Math.pow(10, k) <= maxRank; k++) { // decades on the rank axis
      const y = yRank(Math.pow(10, k));
      grid.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y, y2: y }),
        svg("text", { class: "rank-label", x: L - 6, y: y + 4, "text-anchor": "end" }, String(Math.pow(10, k))));
    }
    for (const f of [0, 0.5, 1]) {
      grid.append(svg("text", { class: "prob-label", x: W - R + 6, y: yProb(f * probTop) + 4 }, cellText(f * probTop)));
    }
    grid.append(svg("line", { x1: L, x2: L, y1: T, y2: T + ph }), svg("line", { x1: W - R, x2: W - R, y1: T, y2: T + ph }),
      svg("line", { x1: L, x2: W - R, y1: T + ph, y2: T + ph }));
    rows.forEach((row, i) => grid.append(
      svg("text", { x: x(i), y: T + ph + 16, "text-anchor": "middle" }, String(row[iLayer]))));
    grid.append(svg("text", { x: L + pw / 2, y: H - 4, "text-anchor": "middle" }, "layer"),
      svg("text", { class: "rank-label", x: 12, y: T + ph / 2, transform: `rotate(-90 12 ${T + ph / 2})`,
        "text-anchor": "middle" }, "rank"),
      svg("text", { class: "prob-label", x: W - 10, y: T + ph / 2, transform: `rotate(90 ${W - 10} ${T + ph / 2})`,
        "text-anchor": "middle" }, "probability"));
    chart.append(grid);
    chart.append(svg("g", { class: "legend" }, // above the plot, where no point can hide it
      svg("line", { class: "rank", x1: L, x2: L + 22, y1: 12, y2: 12 }),
      svg("text", { x: L + 28, y: 16 }, "rank of the target (log scale, 1 = top)"),
      svg("line", { class: "prob", x1: L + 270, x2: L + 292, y1: 12, y2: 12 }),
      svg("text", { x: L + 298, y: 16 }, "probability")));
    const line = (cls, y, idx) => svg("polyline", { class: cls,
      points: rows.map((row, i) => `${x(i).toFixed(1)},${y(row[idx]).toFixed(1)}`).join(" ") });
    chart.append(line("rank", yRank, iRank), line("prob", yProb, iProb));
    rows.forEach((row, i) => {
      chart.append(
        svg("circle", { class: "rank-point", cx: x(i), cy: yRank(row[iRank]), r: 4 },
          svg("title", {}, `${row[iLayer]}: rank ${row[iRank]}`)),
        svg("circle", { class: "prob-point", cx: x(i), cy: yProb(row[iProb]), r: 3.5 },
          svg("title", {}, `${row[iLayer]}: probability ${cellText(row[iProb])}`)));
    });
    return chart;
  }

  // the viridis colour map at t in [0, 1], from five stops
  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function viridis(t) {
    const s = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1), i = Math.min(VIRIDIS.length - 2, Math.floor(s));
    const f = s - i, [a, b] = [VIRIDIS[i], VIRIDIS[i + 1]];
    return `rgb(${a.map((c, k) => Math.round(c + f * (b[k] - c))).join(",")})`;
  }

  // TRACE ... POSITIONS ALL: the logit lens, a stage per row and a position per column
  function lensHeatmap(r) {
    const iPos = col(r, "pos"), iLayer = col(r, "layer"), iProb = col(r, "prob"), iTop = col(r, "top1");
    const positions = [...new Set(r.rows.map((row) => row[iPos]))].sort((a, b) => a - b);
    const stages = [...new Set(r.rows.map((row) => String(row[iLayer])))];
    const cw = Math.max(44, Math.min(90, 600 / positions.length)), ch = 24, L = 48, T = 8, B = 34;
    const W = L + cw * positions.length + 8, H = T + ch * stages.length + B;
    const chart = svg("svg", { class: "chart lens-chart", viewBox: `0 0 ${W} ${H}`, width: W, height: H,
      role: "img", "aria-label": `logit lens: ${stages.length} stages by ${positions.length} positions` });
    for (const row of r.rows) {
      const xi = positions.indexOf(row[iPos]), yi = stages.length - 1 - stages.indexOf(String(row[iLayer]));
      const p = row[iProb], tok = iTop >= 0 ? String(row[iTop]) : "";
      chart.append(svg("rect", { class: "cell", x: L + xi * cw, y: T + yi * ch, width: cw - 1, height: ch - 1,
        fill: viridis(p) }, svg("title", {}, `${row[iLayer]}, position ${row[iPos]}: ${JSON.stringify(tok)} ${cellText(p)}`)));
      if (tok) {
        chart.append(svg("text", { x: L + xi * cw + cw / 2, y: T + yi * ch + ch / 2 + 4,
          "text-anchor": "middle", class: `cell-label ${p > 0.6 ? "on-light" : "on-dark"}` }, JSON.stringify(tok).slice(1, -1).slice(0, 8)));
      }
    }
    stages.forEach((s, k) => chart.append(svg("text", { x: L - 6, y: T + (stages.length - 1 - k) * ch + ch / 2 + 4,
      "text-anchor": "end" }, s)));
    positions.forEach((p, k) => chart.append(svg("text", { x: L + k * cw + cw / 2, y: T + stages.length * ch + 14,
      "text-anchor": "middle" }, String(p))));
    chart.append(svg("text", { x: L + (cw * positions.length) / 2, y: H - 4, "text-anchor": "middle" }, "position"));
    return chart;
  }

  function kindOf(r) {
    const verb = r.statement.trim().split(/\s+/)[0].toUpperCase();
    const has = (...names) => names.every((c) => r.columns.includes(c));
    if (verb === "DESCRIBE" && has("relation", "target")) return "describe";
    if (verb === "TRACE" && has("layer", "rank", "prob") && r.rows.length > 0) return "trace";
    if (verb === "TRACE" && has("pos", "layer", "prob") && r.rows.length > 0) return "lens";
    return "table";
  }

  function renderResult(r) {
    const card = el("article", { class: "result", "data-kind": kindOf(r) },
      el("div", { class: "stmt" }, r.statement, el("span", { class: "ms" }, `${cellText(r.elapsed_ms)} ms`)));
    const kind = kindOf(r);
    if (kind !== "describe" && r.title) card.append(el("div", { class: "title" }, r.title));
    if (kind === "describe") card.append(describeCard(r));
    else if (kind === "trace" || kind === "lens") {
      card.append(kind === "trace" ? traceChart(r) : lensHeatmap(r),
        el("details", {}, el("summary", {}, `${r.rows.length} rows`), table(r)));
    } else if (r.columns.length > 0) card.append(table(r));
    if (r.notes.length > 0) card.append(el("ul", { class: "notes" }, ...r.notes.map((n) => el("li", {}, n))));
    return card;
  }

  // ---- running statements -----------------------------------------------------------------------

  async function run() {
    const text = query.value;
    if (!text.trim()) return;
    closeCompletions();
    runButton.disabled = true;
    statusLine.textContent = "running…";
    const started = performance.now();
    let body;
    try {
      const response = await fetch("/v1/lql", { method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ query: text }) });
      body = await response.json();
    } catch (e) {
      body = { error: { type: "ConnectionError", message: `the server did not answer (${e.message})` } };
    }
    output.replaceChildren(...(body.results || []).map(renderResult));
    if (body.error) { // the CLI's message: line:col, the source line and the caret
      output.append(el("pre", { class: "error", role: "alert" }, `${body.error.type}: ${body.error.message}`));
    }
    statusLine.textContent = `${(body.results || []).length} result(s) in ${((performance.now() - started) / 1000).toFixed(2)} s`;
    runButton.disabled = false;
  }

  // ---- completion -------------------------------------------------------------------------------

  let keywords = [];      // the grammar's keywords (a fallback when the server cannot complete)
  let suggestions = [];   // [{text, start, kind}] shown in the list
  let selected = 0;
  let pending = null;     // the timer of a completion asked for while typing

  function closeCompletions() {
    list.hidden = true;
    suggestions = [];
  }

  function showCompletions(found) {
    suggestions = found;
    selected = 0;
    list.replaceChildren(...found.map((s, i) => {
      const li = el("li", { role: "option", "aria-selected": String(i === 0) },
        el("span", { class: "text" }, s.text), el("span", { class: "kind" }, s.kind));
      li.addEventListener("mousedown", (ev) => { ev.preventDefault(); accept(i); });
      return li;
    }));
    list.hidden = found.length === 0;
  }

  function move(delta) {
    selected = (selected + delta + suggestions.length) % suggestions.length;
    [...list.children].forEach((li, i) => li.setAttribute("aria-selected", String(i === selected)));
    list.children[selected].scrollIntoView({ block: "nearest" });
  }

  function accept(i) {
    const s = suggestions[i], at = query.selectionStart;
    const insert = s.text + (s.kind === "keyword" ? " " : "");
    query.setRangeText(insert, at - s.start, at, "end");
    closeCompletions();
    query.focus();
  }

  async function askCompletions(explicit) {
    const before = query.value.slice(0, query.selectionStart);
    let found = [];
    try {
      const response = await fetch("/v1/lql/complete", { method: "POST",
        headers: { "content-type": "application/json" }, body: JSON.stringify({ text: before }) });
      found = response.ok ? (await response.json()).suggestions : [];
    } catch (e) {
      const word = (before.match(/[A-Za-z_]+$/) || [""])[0].toUpperCase();
      found = word ? keywords.filter((k) => k.startsWith(word)).map((k) => ({ text: k, start: word.length, kind: "keyword" })) : [];
    }
    if (before !== query.value.slice(0, query.selectionStart)) return; // typed on meanwhile
    const word = (before.match(/[A-Za-z_]+$/) || [""])[0];
    // while typing, offer only what continues a word (not every keyword after a space)
    if (!explicit && found.every((s) => s.start === 0)) found = [];
    if (!explicit && found.length === 1 && found[0].start === word.length && found[0].text.toUpperCase() === word.toUpperCase()) found = [];
    showCompletions(found);
  }

  query.addEventListener("keydown", (ev) => {
    if ((ev.ctrlKey || ev.metaKey) && ev.key === "Enter") { ev.preventDefault(); run(); return; }
    if (!list.hidden && suggestions.length > 0) {
      if (ev.key === "ArrowDown") { ev.preventDefault(); move(1); return; }
      if (ev.key === "ArrowUp") { ev.preventDefault(); move(-1); return; }
      if (ev.key === "Enter" || ev.key === "Tab") { ev.preventDefault(); accept(selected); return; }
      if (ev.key === "Escape") { ev.preventDefault(); closeCompletions(); return; }
    }
    if (ev.key === "Tab" && !ev.shiftKey) { ev.preventDefault(); askCompletions(true); return; }
    if (ev.ctrlKey && ev.key === " ") { ev.preventDefault(); askCompletions(true); }
  });

  query.addEventListener("input", () => {
    clearTimeout(pending);
    const last = query.value.slice(0, query.selectionStart).slice(-1);
    if (/[A-Za-z_]/.test(last)) pending = setTimeout(() => askCompletions(false), 120);
    else closeCompletions();
  });
  query.addEventListener("blur", () => setTimeout(closeCompletions, 150));
  runButton.addEventListener("click", run);

  // ---- attention patterns -----------------------------------------------------------------------

  const attnPrompt = $("#attn-prompt"), attnLayer = $("#attn-layer"), attnRun = $("#attn-run"), attnOut = $("#attn-output");
  const label = (tok) => JSON.stringify(tok).slice(1, -1).slice(0, 10);

  // one head: a row per query position, a column per key position, coloured by the weight
  function attentionHeatmap(tokens, weights, layer, head) {
    const n = tokens.length, cs = Math.max(8, Math.min(28, 360 / n)), L = 84, T = 8, B = 78;
    const W = L + cs * n + 8, H = T + cs * n + B;
    const chart = svg("svg", { class: "chart attn-chart", viewBox: `0 0 ${W} ${H}`, width: W, height: H,
      role: "img", "aria-label": `layer ${layer} head ${head}: ${n} queries by ${n} keys`,
      "data-layer": layer, "data-head": head });
    weights.forEach((row, q) => row.forEach((w, k) => {
      chart.append(svg("rect", { class: "cell", x: L + k * cs, y: T + q * cs, width: cs - 1, height: cs - 1,
        fill: viridis(w), "data-q": q, "data-k": k },
        svg("title", {}, `query ${q} ${JSON.stringify(tokens[q])} → key ${k} ${JSON.stringify(tokens[k])}: ${cellText(w)}`)));
    }));
    const small = cs < 11; // too small a cell for a label on every row: every other one
    tokens.forEach((tok, i) => {
      if (small && i % 2) return;
      chart.append(svg("text", { class: "attn-label", x: L - 4, y: T + i * cs + cs / 2 + 3, "text-anchor": "end" }, label(tok)));
      const x = L + i * cs + cs / 2, y = T + n * cs + 6;
      chart.append(svg("text", { class: "attn-label", x, y, "text-anchor": "end",
        transform: `rotate(-60 ${x} ${y})` }, label(tok)));
    });
    return chart;
  }

  async function showAttention() {
    const prompt = attnPrompt.value;
    if (!prompt) return;
    attnRun.disabled = true;
    const params = new URLSearchParams({ prompt, layer: attnLayer.value || "0" });
    let body;
    try {
      const response = await fetch(`/v1/attention?${params}`);
      body = await response.json();
    } catch (e) {
      body = { error: { type: "ConnectionError", message: `the server did not answer (${e.message})` } };
    }
    if (body.error) {
      attnOut.replaceChildren(el("pre", { class: "error", role: "alert" }, `${body.error.type}: ${body.error.message}`));
    } else {
      const layer = body.layers[0], heads = body.patterns[0];
      attnOut.replaceChildren(el("article", { class: "result", "data-kind": "attention" },
        el("div", { class: "title" }, `Attention at layer ${layer} for ${JSON.stringify(body.prompt)} (${body.tokens.length} tokens, ${body.heads} heads)`),
        el("div", { class: "attn-heads" }, ...heads.map((w, h) => el("figure", { class: "attn-head" },
          el("h3", {}, `head ${h}`), attentionHeatmap(body.tokens, w, layer, h))))));
    }
    attnRun.disabled = false;
  }

  attnRun.addEventListener("click", showAttention);
  attnPrompt.addEventListener("keydown", (ev) => { if (ev.key === "Enter") { ev.preventDefault(); showAttention(); } });
  attnLayer.addEventListener("change", () => { if (attnPrompt.value) showAttention(); });

  // ---- what is served ---------------------------------------------------------------------------

  fetch("/v1/info").then((r) => r.json()).then((info) => {
    const parts = [info.model, info.kind === "vindex" ? `vindex, ${info.level} level` : "model",
      `${info.layers} layers`, info.allow_edits ? "edits allowed" : "read-only"];
    $("#info").textContent = parts.join(" · ");
    attnLayer.replaceChildren(...Array.from({ length: info.layers }, (_, i) => el("option", { value: String(i) }, String(i))));
    if (!info.model_weights) $("#attention").hidden = true; // a browse-level vindex runs no attention
  }).catch(() => { $("#info").textContent = "the server did not answer"; });
  fetch("/v1/lql/keywords").then((r) => r.json()).then((k) => { keywords = k.keywords; }).catch(() => {});
})();
