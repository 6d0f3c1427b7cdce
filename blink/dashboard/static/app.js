// Blink dashboard: calls the service's JSON API and draws its charts as plain SVG.
// No third-party code; every text from the server goes in with textContent.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const GiB = 1024 ** 3;
const $ = (id) => document.getElementById(id);

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
function fmtBytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n.toFixed(0)} B` : `${n.toFixed(1)} ${units[i]}`;
}
function fmtNum(x, digits) {
  if (x === null || x === undefined) return "";
  if (Math.abs(x) >= 1000) return x.toFixed(0);
  return x.toFixed(digits === undefined ? 3 : digits);
}
function niceTicks(lo, hi, n) {
  if (!(hi > lo)) { hi = lo + 1; }
  const step0 = (hi - lo) / n;
  const mag = 10 ** Math.floor(Math.log10(step0));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9 * step; v += step) out.push(v);
  return out;
}

async function api(method, path, body) {
  const opts = { method, headers: {} };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  let doc = null;
  try { doc = await r.json(); } catch (e) { doc = null; }
  if (!r.ok) {
    let msg = `HTTP ${r.status}`;
    if (doc && doc.detail) {
      msg += ": " + (typeof doc.detail === "string" ? doc.detail
        : doc.detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; "));
    }
    throw new Error(msg);
  }
  return doc;
}

function setStatus(id, text, isError) {
  const s = $(id);
  s.textContent = text;
  s.className = "status" + (isError ? " error" : "");
}

// ---- charts -------------------------------------------------------------------------------

// Horizontal bars: items = [{label, value}], drawn as rect.bar with a label and a value.
function barChart(svg, items, opts) {
  clear(svg);
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  const left = opts.left || 230, right = 70, top = 6, rowH = Math.min(24, (H - top) / Math.max(items.length, 1));
  const max = Math.max(...items.map((d) => d.value), 1e-12);
  items.forEach((d, i) => {
    const y = top + i * rowH;
    const w = Math.max(1, (W - left - right) * d.value / max);
    const label = d.label.length > 38 ? "…" + d.label.slice(-37) : d.label;
    svg.appendChild(svgEl("text", { x: left - 4, y: y + rowH * 0.65, "text-anchor": "end" }, label));
    const r = svgEl("rect", { class: "bar" + (d.alt ? " alt" : ""), x: left, y: y + 2, width: w, height: rowH - 4 });
    r.appendChild(svgEl("title", {}, `${d.label}: ${opts.fmt(d.value)}`));
    svg.appendChild(r);
    svg.appendChild(svgEl("text", { x: left + w + 4, y: y + rowH * 0.65 }, opts.fmt(d.value)));
  });
}

// Line chart over batch size: points = [{x, y, ok}], hlines = [{y, cls, label}].
function lineChart(svg, points, opts) {
  clear(svg);
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  const L = 56, R = 12, T = 10, B = 30;
  const logx = points.length > 1 && Math.max(...points.map((p) => p.x)) / Math.min(...points.map((p) => p.x)) >= 8;
  const fx = (x) => (logx ? Math.log2(x) : x);
  const xs = points.map((p) => fx(p.x));
  const ys = points.map((p) => p.y).concat((opts.hlines || []).map((h) => h.y));
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  const y0 = 0, y1 = Math.max(...ys) * 1.08 || 1;
  const sx = (x) => L + (W - L - R) * (x1 > x0 ? (fx(x) - x0) / (x1 - x0) : 0.5);
  const sy = (y) => H - B - (H - T - B) * (y - y0) / (y1 - y0);
  for (const t of niceTicks(y0, y1, 5)) {
    svg.appendChild(svgEl("line", { class: "grid", x1: L, x2: W - R, y1: sy(t), y2: sy(t) }));
    svg.appendChild(svgEl("text", { x: L - 4, y: sy(t) + 3, "text-anchor": "end" }, fmtNum(t, t < 10 ? 1 : 0)));
  }
  svg.appendChild(svgEl("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  svg.appendChild(svgEl("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  let lastLabel = -1e9;
  for (const p of [...points].sort((a, b) => a.x - b.x)) {
    if (sx(p.x) - lastLabel < 26) continue;  // keep tick labels apart
    lastLabel = sx(p.x);
    svg.appendChild(svgEl("text", { x: sx(p.x), y: H - B + 12, "text-anchor": "middle" }, String(p.x)));
  }
  svg.appendChild(svgEl("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle" }, "batch size"));
  const d = points.map((p, i) => `${i ? "L" : "M"}${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`).join(" ");
  svg.appendChild(svgEl("path", { class: "line", d }));
  for (const p of points) {
    const c = svgEl("circle", { class: "dot" + (p.ok ? "" : " oom"), cx: sx(p.x), cy: sy(p.y), r: 3.5 });
    c.appendChild(svgEl("title", {}, `batch ${p.x}: ${opts.fmt(p.y)}${p.ok ? "" : " (out of memory)"}`));
    svg.appendChild(c);
  }
  (opts.hlines || []).forEach((h, i) => {
    svg.appendChild(svgEl("line", { class: h.cls, x1: L, x2: W - R, y1: sy(h.y), y2: sy(h.y) }));
    // first label above its line, the next below, so two close lines stay readable
    const dy = i % 2 === 0 ? -3 : 11;
    svg.appendChild(svgEl("text", { x: L + 6, y: sy(h.y) + dy }, h.label));
  });
  if (opts.bestX) {
    svg.appendChild(svgEl("line", { class: "best", x1: sx(opts.bestX), x2: sx(opts.bestX), y1: T, y2: H - B }));
  }
}

// Timeline: host lane and GPU lane; events merged to at most ~W rectangles per lane.
function timelineChart(svg, events) {
  clear(svg);
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  const L = 70, R = 10;
  const end = Math.max(...events.map((e) => Math.max(e.host_end_s, e.gpu_end_s)), 1e-9);
  const sx = (t) => L + (W - L - R) * t / end;
  const lanes = [["host", "host_start_s", "host_end_s", 14, "CPU"], ["gpu", "gpu_start_s", "gpu_end_s", 64, "GPU"]];
  for (const [cls, a, b, y, name] of lanes) {
    svg.appendChild(svgEl("text", { x: 6, y: y + 24 }, name));
    let cur = null;
    const flush = () => {
      if (!cur) return;
      const r = svgEl("rect", { class: cls, x: sx(cur.s), y, width: Math.max(0.6, sx(cur.e) - sx(cur.s)), height: 40 });
      r.appendChild(svgEl("title", {}, `${cur.op} ${((cur.e - cur.s) * 1e3).toFixed(3)} ms`));
      svg.appendChild(r);
    };
    for (const e of events) {
      if (!(e[b] > e[a])) continue;
      if (cur && sx(e[a]) - sx(cur.e) < 0.5) { cur.e = Math.max(cur.e, e[b]); continue; }
      flush();
      cur = { s: e[a], e: e[b], op: e.op };
    }
    flush();
  }
  for (const t of niceTicks(0, end * 1e3, 8)) {
    const x = sx(t / 1e3);
    svg.appendChild(svgEl("line", { class: "axis", x1: x, x2: x, y1: 108, y2: 114 }));
    svg.appendChild(svgEl("text", { x, y: 126, "text-anchor": "middle" }, `${fmtNum(t, 1)} ms`));
  }
}

// ---- predict ------------------------------------------------------------------------------

let lastPrediction = null;

function byOp(p) {
  const acc = new Map();
  for (const u of p.units) acc.set(u.op, (acc.get(u.op) || 0) + u.time_ms);
  return [...acc.entries()].map(([label, value]) => ({ label, value })).sort((a, b) => b.value - a.value);
}
function byModule(p, depth) {
  const acc = new Map();
  for (const u of p.units) {
    const key = u.module ? u.module.split(".").slice(0, depth).join(".") : "(root)";
    acc.set(key, (acc.get(key) || 0) + u.time_ms);
  }
  return [...acc.entries()].map(([label, value]) => ({ label, value })).sort((a, b) => b.value - a.value);
}

function drawModules() {
  if (!lastPrediction) return;
  barChart($("module-chart"), byModule(lastPrediction, +$("module-depth").value).slice(0, 12),
    { fmt: (v) => `${fmtNum(v)} ms`, left: 230 });
}

function optInt(id) {
  const v = $(id).value.trim();
  return v === "" ? null : parseInt(v, 10);
}

async function runPredict() {
  const body = {
    batch_size: optInt("p-batch"), gpu: $("p-gpu").value, dtype: $("p-dtype").value,
    mode: $("p-mode").value,
  };
  const seq = optInt("p-seq");
  if (seq !== null) body.seq_len = seq;
  if ($("p-ckpt").checked) body.grad_checkpointing = true;
  if ($("p-use-config").checked) {
    try { body.model = JSON.parse($("p-config").value); } catch (e) {
      setStatus("predict-status", `the config is not valid JSON: ${e.message}`, true); return;
    }
  } else {
    body.model = $("p-model").value.trim();
  }
  setStatus("predict-status", "predicting…");
  $("predict-run").disabled = true;
  try {
    const t0 = performance.now();
    const p = await api("POST", "/predict", body);
    lastPrediction = p;
    const s = $("predict-summary");
    clear(s);
    s.appendChild(el("b", {}, `${fmtNum(p.time_ms)} ms`));
    s.appendChild(document.createTextNode(
      ` [${fmtNum(p.lower_ms)} .. ${fmtNum(p.upper_ms)}] for ${p.model} on ${p.gpu} (${p.mode}${p.grad_checkpointing ? ", grad checkpointing" : ""}, ${p.dtype}, batch ${p.batch_size}` +
      `${p.seq_len ? ", seq " + p.seq_len : ""}); peak reserved ${fmtBytes(p.peak_reserved_bytes)}, ` +
      `nvidia-smi ~${fmtBytes(p.nvidia_smi_bytes)} of ${fmtBytes(p.memory_budget_bytes || p.gpu_memory_bytes)} `));
    s.appendChild(el("span", { class: p.fits ? "fits-yes" : "fits-no" }, p.fits ? "fits" : "does not fit"));
    barChart($("op-chart"), byOp(p).slice(0, 12), { fmt: (v) => `${fmtNum(v)} ms` });
    drawModules();
    timelineChart($("timeline-chart"), p.timeline);
    $("predict-result").hidden = false;
    setStatus("predict-status", `answered in ${((performance.now() - t0) / 1e3).toFixed(2)} s, ${p.units.length} units`);
    loadHistory();
  } catch (e) {
    $("predict-result").hidden = true;  // an error replaces the previous answer, never sits beside it
    setStatus("predict-status", e.message, true);
  } finally {
    $("predict-run").disabled = false;
  }
}

// ---- planner ------------------------------------------------------------------------------

async function runPlan() {
  const body = { model: $("b-model").value.trim(), gpu: $("b-gpu").value, dtype: $("b-dtype").value,
    mode: $("b-mode").value, max_batch: optInt("b-max") };
  const seq = optInt("b-seq");
  if (seq !== null) body.seq_len = seq;
  if ($("b-ckpt").checked) body.grad_checkpointing = true;
  const budget = $("b-budget").value.trim();
  if (budget) body.memory_budget = /^[0-9]+$/.test(budget) ? parseInt(budget, 10) : budget;
  setStatus("plan-status", "searching for the largest batch that fits…");
  $("plan-run").disabled = true;
  try {
    const s = await api("POST", "/optimize-batch", body);
    const rows = s.rows;
    const pts = (f) => rows.map((r) => ({ x: r.batch_size, y: f(r), ok: r.fits }));
    const best = s.best ? s.best.batch_size : null;
    lineChart($("plan-time"), pts((r) => r.time_ms), { fmt: (v) => `${fmtNum(v)} ms`, bestX: best });
    lineChart($("plan-throughput"), pts((r) => r.throughput), { fmt: (v) => `${fmtNum(v, 1)}/s`, bestX: best });
    lineChart($("plan-memory"), pts((r) => r.nvidia_smi_bytes / GiB), {
      fmt: (v) => `${v.toFixed(2)} GiB`, bestX: best,
      hlines: [{ y: s.budget_bytes / GiB, cls: "budget", label: `budget ${(s.budget_bytes / GiB).toFixed(1)} GiB` },
               { y: s.usable_bytes / GiB, cls: "usable", label: `less ${(100 * s.safety_margin).toFixed(0)}% margin` }],
    });
    const sum = $("plan-summary");
    clear(sum);
    sum.appendChild(el("b", {}, s.max_batch_size ? `largest batch that fits: ${s.max_batch_size}` : "no batch fits"));
    if (s.best) sum.appendChild(document.createTextNode(`; best throughput at batch ${s.best.batch_size}: ${fmtNum(s.best.throughput, 1)} samples/s`));
    for (const n of s.notes) sum.appendChild(el("div", { class: "note" }, n));
    const t = $("plan-table");
    clear(t);
    const hr = el("tr");
    for (const h of ["batch", "time ms", "samples/s", "peak reserved", "+context", "fits"]) hr.appendChild(el("th", {}, h));
    t.appendChild(hr);
    for (const r of rows) {
      const tr = el("tr");
      for (const v of [r.batch_size, fmtNum(r.time_ms), fmtNum(r.throughput, 1), fmtBytes(r.peak_reserved_bytes), fmtBytes(r.nvidia_smi_bytes), r.fits ? "yes" : "no"]) tr.appendChild(el("td", {}, String(v)));
      t.appendChild(tr);
    }
    $("plan-result").hidden = false;
    setStatus("plan-status", `${rows.length} batch sizes`);
  } catch (e) {
    $("plan-result").hidden = true;  // an error replaces the previous answer, never sits beside it
    setStatus("plan-status", e.message, true);
  } finally {
    $("plan-run").disabled = false;
  }
}

// ---- compare ------------------------------------------------------------------------------

async function runCompare() {
  const split = (s) => s.split(",").map((x) => x.trim()).filter((x) => x);
  const gpus = [...document.querySelectorAll("#c-gpus input:checked")].map((c) => c.value);
  const body = { models: split($("c-models").value), gpus: gpus.length ? gpus : ["H200"],
    dtypes: split($("c-dtypes").value), batch_size: optInt("c-batch"), mode: $("c-mode").value };
  setStatus("compare-status", "predicting every combination…");
  $("compare-run").disabled = true;
  try {
    const c = await api("POST", "/compare", body);
    $("compare-chart").setAttribute("height", String(Math.max(60, 24 * c.rows.length + 12)));
    barChart($("compare-chart"), c.rows.map((r) => ({ label: `${r.model} · ${r.gpu} · ${r.dtype}`, value: r.time_ms, alt: !r.fits })),
      { fmt: (v) => `${fmtNum(v)} ms`, left: 330 });
    const t = $("compare-table");
    clear(t);
    const hr = el("tr");
    for (const h of ["model", "GPU", "dtype", "time ms", "samples/s", "+context", "fits", "relative"]) hr.appendChild(el("th", {}, h));
    t.appendChild(hr);
    for (const r of c.rows) {
      const tr = el("tr");
      [r.model, r.gpu, r.dtype, fmtNum(r.time_ms), fmtNum(r.throughput, 1), fmtBytes(r.nvidia_smi_bytes), r.fits ? "yes" : "no", `${r.relative.toFixed(2)}x`]
        .forEach((v, i) => tr.appendChild(el("td", i < 3 ? { class: "l" } : {}, String(v))));
      t.appendChild(tr);
    }
    $("compare-result").hidden = false;
    setStatus("compare-status", `${c.rows.length} combinations`);
  } catch (e) {
    $("compare-result").hidden = true;  // an error replaces the previous answer, never sits beside it
    setStatus("compare-status", e.message, true);
  } finally {
    $("compare-run").disabled = false;
  }
}

// ---- history and monitor ------------------------------------------------------------------

async function loadHistory() {
  try {
    const h = await api("GET", "/history");
    const ds = h.datasets.filter((d) => !d.error);
    $("history-datasets").textContent = ds.length
      ? `measured values from ${ds.map((d) => `${d.path} (${d.runs} runs, ${d.device})`).join(", ")}`
      : "no collected dataset loaded (blink dashboard --dataset DIR, or data/): measured columns stay empty";
    const tb = document.querySelector("#history-table tbody");
    clear(tb);
    for (const e of h.entries) {
      const m = e.measured;
      const tr = el("tr", { class: m ? "has-measured" : "" });
      [e.at, e.model, e.gpu, e.dtype, e.mode, e.batch_size, e.seq_len ?? "", fmtNum(e.time_ms),
        m ? `${fmtNum(m.time_ms)}${m.device === "cpu" ? " (CPU)" : ""}` : "", fmtBytes(e.peak_reserved_bytes),
        m ? fmtBytes(m.peak_reserved_bytes) : "", e.fits ? "yes" : "no"]
        .forEach((v, i) => tr.appendChild(el("td", i < 5 ? { class: "l" } : {}, String(v))));
      tb.appendChild(tr);
    }
  } catch (e) {
    $("history-datasets").textContent = `history unavailable: ${e.message}`;
  }
}

const nvmlSeries = [];
async function pollNvml() {
  let s;
  try { s = await api("GET", "/nvml"); } catch (e) { s = { available: false, reason: e.message }; }
  if (!s.available) {
    $("nvml-section").hidden = true;
    $("nvml-note").textContent = `Live GPU utilisation is hidden: ${s.reason}.`;
    return false;
  }
  $("nvml-note").textContent = "";
  $("nvml-section").hidden = false;
  const t = $("nvml-table");
  clear(t);
  const hr = el("tr");
  for (const h of ["GPU", "name", "util %", "memory used", "of", "°C", "W"]) hr.appendChild(el("th", {}, h));
  t.appendChild(hr);
  for (const g of s.gpus) {
    const tr = el("tr");
    [g.index, g.name, g.util_percent, fmtBytes(g.memory_used_bytes), fmtBytes(g.memory_total_bytes), g.temperature_c ?? "", g.power_w ? g.power_w.toFixed(0) : ""]
      .forEach((v) => tr.appendChild(el("td", {}, String(v))));
    t.appendChild(tr);
  }
  nvmlSeries.push(s.gpus[0].util_percent);
  if (nvmlSeries.length > 120) nvmlSeries.shift();
  lineChart($("nvml-chart"), nvmlSeries.map((y, i) => ({ x: i + 1, y, ok: true })), { fmt: (v) => `${v}%` });
  return true;
}

// ---- start --------------------------------------------------------------------------------

async function init() {
  $("predict-run").addEventListener("click", runPredict);
  $("plan-run").addEventListener("click", runPlan);
  $("compare-run").addEventListener("click", runCompare);
  $("module-depth").addEventListener("change", drawModules);
  $("p-use-config").addEventListener("change", () => { $("p-config").hidden = !$("p-use-config").checked; });
  try {
    const [models, gpus] = await Promise.all([api("GET", "/models"), api("GET", "/gpus")]);
    for (const m of models.models) $("model-names").appendChild(el("option", { value: m.name }));
    for (const sel of document.querySelectorAll(".gpu-select")) {
      for (const g of gpus) sel.appendChild(el("option", { value: g.name }, g.name));
      sel.value = "H200";
    }
    for (const g of gpus) {
      const lab = el("label");
      const box = el("input", { type: "checkbox", value: g.name });
      if (g.name === "H200" || g.name === "A100-80GB") box.checked = true;
      lab.appendChild(box);
      lab.appendChild(document.createTextNode(" " + g.name));
      $("c-gpus").appendChild(lab);
    }
  } catch (e) {
    setStatus("predict-status", `cannot reach the service: ${e.message}`, true);
  }
  loadHistory();
  if (await pollNvml()) setInterval(pollNvml, 2000);
  document.body.setAttribute("data-ready", "1");
}
init();
