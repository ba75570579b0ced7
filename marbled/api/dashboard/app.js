/* The marbled dashboard: plain JavaScript and SVG, no library, no build step.

   Everything shown comes from the broker's JSON API, polled every POLL_MS: GET /v1/status,
   /v1/jobs, /v1/runs, /v1/jobs/{id} (the job clicked), and /v1/forecast where the broker's
   OpenAPI document lists it. Fields a broker may not have yet (rate, eta_s, finish_at,
   reasons) are shown when present; without them the page estimates a running job's rate
   from the steps it saw between polls (marked "≈").

   Auth: the token comes from the URL fragment (#token=..., which the browser never sends to
   the server), is kept in this tab's sessionStorage, and is sent as "Authorization: Bearer"
   on every request; the fragment is then taken out of the address bar. */
"use strict";

const POLL_MS = 1500;
const HIDDEN_POLL_MS = 5000;  // a tab in the background asks less often
const FORECAST_EVERY_MS = 10000;  // the forecast runs the simulator: ask on changes, or this
const TOKEN_KEY = "marbled-token";
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
  "#b07aa1", "#ff9da7", "#9c755f", "#6b7b8c"];
const FINAL = new Set(["done", "failed", "cancelled"]);
const WAITING = new Set(["queued", "suspended"]);
const STATE_ORDER = ["running", "suspending", "queued", "suspended", "done", "failed",
  "cancelled"];
const SVG_NS = "http://www.w3.org/2000/svg";
const LOG_LINES = 500;  // the log tab: the tail of the job's latest run, this many lines
const LOG_BYTES = 262144;  // ... within this many bytes
// The page asks for what is unfinished and what ended in this last stretch (?since=): a
// long allocation's history (20,000 jobs) is neither fetched nor drawn at every poll.
// #window=SECONDS in the address sets another.
const WINDOW_S = 3600;

const ui = {
  token: null,
  selected: null,  // the job id clicked
  data: null,  // {status, jobs, runs}
  detail: null,  // GET /v1/jobs/{selected}
  tab: "details",  // the detail panel's tab: "details" or "log"
  logStream: "stdout",
  log: null,  // GET /v1/jobs/{selected}/log (the log tab's)
  forecast: null,
  forecastRoute: false,  // whether this broker serves /v1/forecast
  forecastAt: 0,
  forecastKey: "",
  skew: 0,  // the broker's clock minus ours (seconds), from the Date header
  window: WINDOW_S,  // seconds of history shown (#window=)
  floor: 0,  // the latest time the broker reported: "now" is never before it
  rates: new Map(),  // job id -> {run, samples: [{t, step}]}, for the estimates
  polls: 0,
  lastOk: null,
  timer: null,
};

/* ---------- small helpers ---------- */

const $ = (id) => document.getElementById(id);

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

function colour(jobId) {
  return PALETTE[(Number(jobId) - 1 + PALETTE.length) % PALETTE.length];
}

function now() {
  return Math.max(Date.now() / 1000 + ui.skew, ui.floor);
}

function jobLabel(job) {
  if (!job) return "";
  if (job.name) return job.name;
  if (job.model) return job.model;
  return (job.command || []).join(" ").slice(0, 40) || `job ${job.id}`;
}

function duration(s) {
  if (s == null || !isFinite(s)) return "—";
  s = Math.max(0, s);
  if (s < 10) return `${s.toFixed(1)} s`;
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) {
    const m = Math.floor(s / 60);
    return `${m} min ${String(Math.round(s % 60)).padStart(2, "0")} s`;
  }
  const h = Math.floor(s / 3600);
  return `${h} h ${String(Math.round((s % 3600) / 60)).padStart(2, "0")} min`;
}

function clockSpan(s) {  // an offset on the timeline: "12.5 s", "3:05", "1:02:03"
  if (Math.abs(s) < 0.05) s = 0;  // a submission a few ms before the first run
  const sign = s < 0 ? "-" : "";
  s = Math.abs(s);
  if (s < 60) return `${sign}${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = String(Math.floor(s % 60)).padStart(2, "0");
  return h ? `${sign}${h}:${String(m).padStart(2, "0")}:${sec}` : `${sign}${m}:${sec}`;
}

function wallClock(ts) {
  return ts == null ? "—" : new Date(ts * 1000).toLocaleTimeString();
}

function rate(r) {
  if (r == null || !isFinite(r)) return "—";
  return r >= 100 ? r.toFixed(0) : r >= 10 ? r.toFixed(1) : r.toFixed(2);
}

function badge(state) {
  return `<span class="badge s-${esc(state)}">${esc(state)}</span>`;
}

function swatch(jobId, role) {
  const hatched = role === "secondary" ? " hatched" : "";
  return `<span class="swatch${hatched}" style="--c:${colour(jobId)}"></span>`;
}

/* ---------- the API ---------- */

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function windowFromAddress() {
  const asked = Number(new URLSearchParams(location.hash.replace(/^#/, "")).get("window"));
  return asked > 0 && isFinite(asked) ? asked : WINDOW_S;
}

function takeToken() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ""));
  let token = params.get("token");
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else token = sessionStorage.getItem(TOKEN_KEY);
  } catch (e) { /* storage disabled: the token lives as long as the page */ }
  if (params.has("token")) {  // out of the address bar, the history and screenshots
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  }
  return token;
}

async function api(path) {
  const headers = { Accept: "application/json" };
  if (ui.token) headers.Authorization = `Bearer ${ui.token}`;
  let resp;
  try {
    resp = await fetch(`../v1/${path}`, { headers, cache: "no-store", credentials: "omit" });
  } catch (e) {
    throw new ApiError(0, "the broker does not answer (stopped, or the connection is down)");
  }
  const date = Date.parse(resp.headers.get("Date") || "");
  if (!isNaN(date)) {  // a broker on another host may keep another time (1 s resolution)
    const skew = date / 1000 - Date.now() / 1000;
    ui.skew = Math.abs(skew) > 3 ? skew : 0;
  }
  let doc = null;
  try { doc = await resp.json(); } catch (e) { doc = null; }
  if (!resp.ok) throw new ApiError(resp.status, (doc && doc.error) || resp.statusText);
  return doc;
}

async function detectForecast() {
  try {
    const spec = await api("openapi.json");
    ui.forecastRoute = Boolean(spec && spec.paths && spec.paths["/v1/forecast"]);
  } catch (e) {
    if (e.status === 401 || e.status === 403) throw e;
    ui.forecastRoute = false;
  }
}

async function optional(promise) {  // a part of the page that may fail alone
  try { return await promise; } catch (e) {
    if (e.status === 401 || e.status === 403 || e.status === 0) throw e;
    return null;
  }
}

async function poll() {
  try {
    if (ui.polls === 0) await detectForecast();
    const selected = ui.selected;
    const since = Math.max(0, now() - ui.window).toFixed(3);
    const [status, jobs, runs, detail] = await Promise.all([
      api("status"), api(`jobs?since=${since}`), api(`runs?since=${since}`),
      selected == null ? null : optional(api(`jobs/${selected}`)),
    ]);
    const key = jobs.jobs.map((j) => `${j.id}:${j.state}`).join(",");
    if (ui.forecastRoute && (key !== ui.forecastKey || Date.now() - ui.forecastAt > FORECAST_EVERY_MS)) {
      const forecast = await optional(api("forecast"));
      ui.forecast = forecast;
      ui.forecastKey = key;
      ui.forecastAt = Date.now();
    }
    ui.data = { status, jobs: jobs.jobs, runs: runs.runs };
    if (selected === ui.selected) ui.detail = detail;
    if (selected != null && ui.tab === "log") {  // the log tab follows while it is open
      const log = await optional(api(logPath(selected)));
      if (selected === ui.selected && log) ui.log = log;
    }
    ui.polls += 1;
    ui.lastOk = Date.now();
    noteTimes();
    trackRates();
    hideAlert();
    render();
    setConnection(true);
  } catch (e) {
    if (e.status === 401 || e.status === 403) {
      showAlert(ui.token
        ? `The broker refused this page's token (${e.status}: ${esc(e.message)}). A broker writes a `
          + "new token at every start: open the address <code>marble dashboard</code> prints now."
        : "This page needs the broker's token. On a node of the allocation run "
          + "<code>marble dashboard</code> and open the address it prints "
          + "(it ends in <code>#token=…</code>).");
    }
    setConnection(false, e.message);
  } finally {
    document.body.dataset.polls = String(ui.polls);
    clearTimeout(ui.timer);
    ui.timer = setTimeout(poll, document.hidden ? HIDDEN_POLL_MS : POLL_MS);
  }
}

function noteTimes() {
  let latest = 0;
  for (const r of ui.data.runs) latest = Math.max(latest, r.started_at || 0, r.ended_at || 0);
  for (const j of ui.data.jobs) latest = Math.max(latest, j.submitted_at || 0, j.finished_at || 0);
  ui.floor = Math.max(ui.floor, latest);
}

function trackRates() {
  const t = now();
  const live = new Map();
  for (const r of ui.data.runs) if (r.ended_at == null) live.set(r.job_id, r.id);
  for (const job of ui.data.jobs) {
    if (job.state !== "running" || !live.has(job.id) || job.step == null) {
      ui.rates.delete(job.id);
      continue;
    }
    let h = ui.rates.get(job.id);
    if (!h || h.run !== live.get(job.id)) {
      h = { run: live.get(job.id), samples: [] };
      ui.rates.set(job.id, h);
    }
    h.samples.push({ t, step: job.step });
    while (h.samples.length > 2 && t - h.samples[1].t > 20) h.samples.shift();
  }
}

/* What the page knows of a running job's speed and end: the broker's numbers when it
   has them, else the forecast's end, else the page's own estimate. */
function progressOf(job, forecastEnds) {
  const t = now();
  const out = { rate: null, eta: null, end: null, estimated: false, source: job.rate_source,
    planned: null };
  if (job.state !== "running") return out;
  // the forecast's end knows what the policy will do next (a promotion); `end` is at the
  // job's current speed
  if (forecastEnds.has(job.id)) out.planned = forecastEnds.get(job.id).end_at;
  if (job.rate != null) out.rate = job.rate;
  if (job.finish_at != null) out.end = job.finish_at;
  else if (job.eta_s != null) out.end = t + job.eta_s;
  else if (forecastEnds.has(job.id)) out.end = forecastEnds.get(job.id).end_at;
  if (out.rate == null || out.end == null) {
    const h = ui.rates.get(job.id);
    if (h && h.samples.length >= 2) {
      const a = h.samples[0];
      const b = h.samples[h.samples.length - 1];
      if (b.t - a.t >= 2 && b.step > a.step) {
        const r = (b.step - a.step) / (b.t - a.t);
        if (out.rate == null) { out.rate = r; out.estimated = true; }
        if (out.end == null && job.steps) {
          out.end = t + Math.max(job.steps - job.step, 0) / r;
          out.estimated = true;
        }
      }
    }
  }
  if (out.end != null) out.eta = Math.max(out.end - t, 0);
  return out;
}

/* ---------- rendering ---------- */

function render() {
  if (!ui.data) return;
  const forecastEnds = new Map(((ui.forecast && ui.forecast.jobs) || [])
    .filter((f) => f && f.id != null).map((f) => [f.id, f]));
  const t0 = timelineStart();
  renderHeader(ui.data.status);
  renderTimeline(t0, forecastEnds);
  renderJobs(t0, forecastEnds);
  renderQueue(forecastEnds);
  renderDetail(t0);
}

function timelineStart() {
  const { runs, jobs, status } = ui.data;
  let t0 = Infinity;
  for (const r of runs) t0 = Math.min(t0, r.started_at);
  if (!isFinite(t0)) for (const j of jobs) t0 = Math.min(t0, j.submitted_at);
  return isFinite(t0) ? t0 : status.started_at;
}

function renderHeader(status) {
  const nodes = Object.entries(status.nodes || {});
  const total = nodes.reduce((n, [, v]) => n + v.gpus.length, 0);
  const free = nodes.reduce((n, [, v]) => n + v.free.length, 0);
  const parts = [
    `marbled <b>${esc(status.pid)}</b>`,
    `policy <b>${esc(status.policy)}</b>`,
    `profile ${esc(status.profile)}`,
    `${nodes.length} node${nodes.length === 1 ? "" : "s"}: <b>${total - free}/${total}</b> GPUs busy`,
  ];
  if (status.time_scale && status.time_scale !== 1) {
    parts.push(`<span class="chip" title="emulated jobs run at --time-scale ${esc(status.time_scale)}">`
      + `time ×${esc(+(1 / status.time_scale).toPrecision(3))}</span>`);
  }
  if (status.draining) parts.push('<span class="chip warn">draining</span>');
  const storage = status.storage;
  if (storage && !storage.ok) {  // lifecycle I4: writes held in memory, submissions refused
    parts.push(`<span class="chip warn" id="storage" title="${esc(storage.reason)}">`
      + `storage: ${esc(storage.held)} write(s) held</span>`);
  }
  $("broker").innerHTML = parts.join('<span class="sep">·</span>');
  const counts = status.jobs || {};
  $("counts").innerHTML = STATE_ORDER.filter((s) => counts[s])
    .map((s) => `<span class="count s-${s}"><b>${counts[s]}</b> ${s}</span>`).join("")
    || '<span class="count">no jobs</span>';
}

function setConnection(ok, message) {
  const el = $("conn");
  el.className = `conn ${ok ? "ok" : "bad"}`;
  $("conn-text").textContent = ok ? `live · ${new Date().toLocaleTimeString()}`
    : `no answer${ui.lastOk ? ` since ${new Date(ui.lastOk).toLocaleTimeString()}` : ""}`;
  el.title = ok ? `polls the broker every ${POLL_MS / 1000} s` : message || "";
}

function showAlert(html) {
  const el = $("alert");
  el.innerHTML = html;
  el.hidden = false;
}

function hideAlert() {
  $("alert").hidden = true;
}

function niceStep(raw) {
  const steps = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
    7200, 10800, 21600, 43200, 86400];
  return steps.find((s) => s >= raw) || 86400 * Math.ceil(raw / 86400);
}

function svg(tag, attrs, text) {
  const parts = Object.entries(attrs).filter(([, v]) => v != null)
    .map(([k, v]) => `${k}="${esc(v)}"`).join(" ");
  return `<${tag} ${parts}>${text ?? ""}</${tag}>`;
}

function gpuRows(status, runs) {
  const rows = [];
  const index = new Map();
  const add = (node, gpu, dev) => {
    index.set(`${node}/${gpu}`, rows.length);
    rows.push({ node, gpu, dev });
  };
  const nodes = Object.entries(status.nodes || {});
  for (const [node, info] of nodes) info.gpus.forEach((dev, i) => add(node, i, dev));
  const extra = new Map();  // runs on nodes this broker does not have (an earlier broker's)
  for (const r of runs) {
    for (const [node, gpus] of r.parts || [[r.node, r.gpus]]) {
      if (status.nodes && status.nodes[node]) continue;
      extra.set(node, Math.max(extra.get(node) ?? -1, ...gpus));
    }
  }
  for (const [node, top] of extra) for (let g = 0; g <= top; g++) add(node, g, String(g));
  return { rows, index };
}

function renderTimeline(t0, forecastEnds) {
  const { status, runs, jobs } = ui.data;
  const el = $("timeline");
  const jobsById = new Map(jobs.map((j) => [j.id, j]));
  const { rows, index } = gpuRows(status, runs);
  if (!rows.length) {
    el.innerHTML = '<p class="empty">The broker has no GPUs.</p>';
    return;
  }
  const active = jobs.some((j) => !FINAL.has(j.state)) || runs.some((r) => r.ended_at == null);
  let lastEnd = t0;
  for (const r of runs) lastEnd = Math.max(lastEnd, r.ended_at ?? now());
  const t = active ? now() : lastEnd;  // all ended: the axis stops with the last run
  const rowH = rows.length <= 16 ? 28 : rows.length <= 48 ? 16 : 9;
  const gap = rows.length <= 48 ? 10 : 4;
  const left = 132;
  const right = 18;
  const top = 22;
  const width = Math.max(el.clientWidth, 520);
  const plotW = width - left - right;

  // expected ends of the running runs: the forecast's dashed continuation
  const ghosts = [];
  let horizon = t;
  for (const r of runs) {
    const job = jobsById.get(r.job_id);
    if (r.ended_at != null || !job || job.state !== "running") continue;
    const p = progressOf(job, forecastEnds);
    const end = p.planned ?? p.end;
    if (end != null && end > t) {
      ghosts.push({ run: r, end, estimated: p.planned == null && p.estimated,
        forecast: p.planned != null });
      horizon = Math.max(horizon, end);
    }
  }
  const finishAt = active && ui.forecast ? ui.forecast.finish_at : null;
  if (finishAt && finishAt > t) horizon = Math.max(horizon, finishAt);
  const span = Math.max(horizon - t0, 1) * 1.02;
  const x = (ts) => left + Math.max(0, Math.min(1, (ts - t0) / span)) * plotW;

  // rows: y of each GPU, a gap between nodes
  const ys = [];
  let y = top;
  rows.forEach((row, i) => {
    if (i > 0 && rows[i - 1].node !== row.node) y += gap;
    ys.push(y);
    y += rowH;
  });
  const plotBottom = y;
  const height = plotBottom + 34;

  const out = [];
  const defs = [];
  const hatched = new Set();
  // background bands per node and GPU labels
  let start = 0;
  rows.forEach((row, i) => {
    out.push(svg("rect", { class: i % 2 ? "lane odd" : "lane", x: left, y: ys[i], width: plotW, height: rowH }));
    const label = rowH >= 14 ? `gpu ${row.gpu}` : "";
    if (label) {
      out.push(svg("text", { class: "gpu-label", x: left - 8, y: ys[i] + rowH / 2 + 4, "text-anchor": "end" },
        esc(label) + (row.dev !== String(row.gpu) ? svg("title", {}, esc(`device ${row.dev}`)) : "")));
    }
    if (i === rows.length - 1 || rows[i + 1].node !== row.node) {
      const mid = (ys[start] + ys[i] + rowH) / 2;
      out.push(svg("text", { class: "node-label", x: 6, y: mid + 4 }, esc(row.node.slice(0, 12))
        + svg("title", {}, esc(`node ${row.node}`))));
      start = i + 1;
    }
  });

  // time axis
  const step = niceStep(span / Math.max(plotW / 90, 1));
  for (let s = 0; s <= span + 1e-9; s += step) {
    const xx = x(t0 + s);
    out.push(svg("line", { class: "grid", x1: xx, x2: xx, y1: top - 4, y2: plotBottom }));
    out.push(svg("text", { class: "tick", x: xx, y: plotBottom + 15, "text-anchor": "middle" },
      esc(step >= 60 ? clockSpan(s) : `${+s.toFixed(1)} s`)));
  }
  out.push(svg("text", { class: "axis-title", x: left + plotW, y: plotBottom + 30, "text-anchor": "end" },
    esc(`real time since the first run (${wallClock(t0)})`)));

  // shared GPUs (share > 1): each run takes a slot of the GPU's row
  const slots = new Map();
  const slotOf = (run, rowIndex) => {
    const key = `${run.id}/${rowIndex}`;
    if (slots.has(key)) return slots.get(key);
    const taken = runs.filter((o) => o !== run && o.share > 1 && slots.has(`${o.id}/${rowIndex}`)
      && o.started_at < (run.ended_at ?? Infinity) && run.started_at < (o.ended_at ?? Infinity))
      .map((o) => slots.get(`${o.id}/${rowIndex}`));
    let slot = 0;
    while (taken.includes(slot)) slot++;
    slots.set(key, slot % run.share);
    return slot % run.share;
  };

  const bars = [];
  const labels = [];
  for (const r of [...runs].sort((a, b) => a.started_at - b.started_at)) {
    const job = jobsById.get(r.job_id);
    const c = colour(r.job_id);
    const secondary = r.role === "secondary";
    if (secondary && !hatched.has(r.job_id)) {
      hatched.add(r.job_id);
      defs.push(`<pattern id="hatch-${r.job_id}" patternUnits="userSpaceOnUse" width="7" height="7" patternTransform="rotate(45)">`
        + `<rect width="7" height="7" fill="${c}" fill-opacity="0.22"/>`
        + `<rect width="2.6" height="7" fill="${c}" fill-opacity="0.85"/></pattern>`);
    }
    const x1 = x(r.started_at);
    const x2 = Math.max(x(r.ended_at ?? t), x1 + 2);
    const dim = ui.selected != null && ui.selected !== r.job_id ? " dim" : "";
    const sel = ui.selected === r.job_id ? " selected" : "";
    const cls = `bar ${secondary ? "secondary" : "primary"}${r.ended_at == null ? " live" : ""}${dim}${sel}`;
    const steps = `${r.start_step ?? 0} → ${r.end_step ?? (r.ended_at == null ? (job && job.step) ?? "…" : "?")}`;
    const tip = `#${r.job_id} ${jobLabel(job)} · run ${r.id}, ${r.role}\n`
      + `${(r.parts || [[r.node, r.gpus]]).map(([n, g]) => `${n}: GPU ${g.join(", ")}`).join("; ")}`
      + `${r.share > 1 ? ` (1/${r.share} of each)` : ""}\n`
      + `steps ${steps}\n+${clockSpan(r.started_at - t0)} → `
      + `${r.ended_at == null ? "running" : `+${clockSpan(r.ended_at - t0)} (${r.end_reason || "ended"})`}`
      + `, ${duration((r.ended_at ?? t) - r.started_at)}`;
    for (const [node, gpus] of r.parts || [[r.node, r.gpus]]) {
      const idx = gpus.map((g) => index.get(`${node}/${g}`)).filter((i) => i != null).sort((a, b) => a - b);
      // consecutive rows make one block, as in the paper's Figure 5
      const blocks = [];
      for (const i of idx) {
        const last = blocks[blocks.length - 1];
        if (r.share <= 1 && last && last[1] === i - 1) last[1] = i;
        else blocks.push([i, i]);
      }
      for (const [a, b] of blocks) {
        let by = ys[a] + 2;
        let bh = ys[b] + rowH - ys[a] - 4;
        if (r.share > 1) {
          bh = (rowH - 4) / r.share;
          by = ys[a] + 2 + slotOf(r, a) * bh;
        }
        bars.push(svg("rect", {
          class: cls, x: x1, y: by, width: x2 - x1, height: Math.max(bh, 2), rx: 3,
          fill: secondary ? `url(#hatch-${r.job_id})` : c, stroke: c,
          "data-run-id": r.id, "data-job-id": r.job_id,
        }, svg("title", {}, esc(tip))));
        const text = `#${r.job_id} ${jobLabel(job)}`;
        const room = Math.floor((x2 - x1 - 10) / 6.6);
        if (room >= 2 && bh >= 11) {
          const shown = text.length <= room ? text : room > 4 ? `${text.slice(0, room - 1)}…` : `#${r.job_id}`;
          labels.push(svg("text", {
            class: `bar-label ${secondary ? "on-light" : "on-dark"}${dim}`,
            x: x1 + 6, y: by + bh / 2 + 4, "data-job-id": r.job_id,
          }, esc(shown)));
        }
      }
    }
  }
  for (const g of ghosts) {
    const r = g.run;
    const c = colour(r.job_id);
    const dim = ui.selected != null && ui.selected !== r.job_id ? " dim" : "";
    for (const [node, gpus] of r.parts || [[r.node, r.gpus]]) {
      const idx = gpus.map((gg) => index.get(`${node}/${gg}`)).filter((i) => i != null).sort((a, b) => a - b);
      if (!idx.length) continue;
      const a = idx[0];
      const b = idx[idx.length - 1];
      bars.push(svg("rect", {
        class: `ghost${dim}`, x: x(t), y: ys[a] + 3, width: Math.max(x(g.end) - x(t), 1),
        height: ys[b] + rowH - ys[a] - 6, rx: 3, stroke: c, "data-job-id": r.job_id,
      }, svg("title", {}, esc(`#${r.job_id}: expected to end at ${wallClock(g.end)}`
        + ` (in ${duration(g.end - t)}${g.forecast ? ", the broker's forecast"
          : g.estimated ? ", estimated by this page" : ""})`))));
    }
  }
  out.push(...bars, ...labels);

  // now, and the forecast's end of the queue
  if (active) {
    const xn = x(t);
    out.push(svg("line", { class: "now", x1: xn, x2: xn, y1: top - 6, y2: plotBottom + 2 }));
    out.push(svg("text", { class: "now-label", x: xn, y: top - 9, "text-anchor": "middle" }, "now"));
  }
  if (finishAt && finishAt > t) {
    const xf = x(finishAt);
    out.push(svg("line", { class: "finish", x1: xf, x2: xf, y1: top - 6, y2: plotBottom + 2 }));
    out.push(svg("text", { class: "finish-label", x: xf, y: top - 9, "text-anchor": "end" },
      esc(`all done ≈ ${wallClock(finishAt)}`)));
  }

  el.innerHTML = `<svg xmlns="${SVG_NS}" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}"`
    + ` role="img" aria-label="GPU timeline"><defs>${defs.join("")}</defs>${out.join("")}</svg>`;
  const why = active && ui.forecast && !ui.forecast.finish_at && ui.forecast.reason;
  // the jobs the forecast cannot play (no curve yet...), as `marble status` says them
  const skipped = (active && ui.forecast && ui.forecast.left_out) || [];
  const skippedCount = (ui.forecast && ui.forecast.left_out_count) || skipped.length;
  const leftOut = skipped.length ? "the forecast leaves out "
    + skipped.slice(0, 3).map((j) => `job ${j.id} (${j.why})`).join(", ")
    + (skippedCount > 3 ? ` and ${skippedCount - 3} more` : "") : "";
  $("legend").innerHTML = legend() + (why ? `<span class="note">no forecast: ${esc(why)}</span>` : "")
    + (leftOut ? `<span class="note">${esc(leftOut)}</span>` : "");
}

function legend() {
  const item = (icon, text, title) => `<span class="legend-item" title="${esc(title)}">${icon}${esc(text)}</span>`;
  return [
    item('<span class="key primary"></span>', "primary", "on its optimal (or requested) GPU count"),
    item('<span class="key secondary"></span>', "secondary",
      "on leftover GPUs, fewer than its optimum: suspended and promoted when more are free"),
    item('<span class="key ghost"></span>', "expected", "until the expected end of a running job"),
    item('<span class="key now"></span>', "now", "the broker's time"),
  ].join("");
}

function lastRuns() {
  const last = new Map();
  for (const r of ui.data.runs) {
    const seen = last.get(r.job_id);
    if (!seen || r.started_at >= seen.started_at) last.set(r.job_id, r);
  }
  return last;
}

function gpusText(job, last) {
  if (job.gpus && job.gpus.length && !FINAL.has(job.state)) {
    return `<b>${job.gpus.length}</b> <span class="sub-inline">${esc(job.gpus.join(",").replace(/,/g, ",\u200b"))}`
      + `${job.node ? ` @${esc(job.node)}` : ""}</span>`;
  }
  if (FINAL.has(job.state) && last) {
    return `<span class="muted">ran on ${esc(last.gpus.length)}</span>`;
  }
  const want = job.gpus_request === "auto" ? `${job.demand ?? "?"} (auto)` : job.gpus_request;
  // why that count: the broker's one answer (core/target.py), as marble status and curves
  return `<span class="muted"${job.want ? ` title="${esc(job.want.text)}"` : ""}>wants ${esc(want)}</span>`;
}

function progressCell(job) {
  if (!job.steps) return job.step != null ? `<span class="steps">step ${esc(job.step)}</span>` : "—";
  const step = FINAL.has(job.state) && job.state === "done" ? job.steps : (job.step ?? 0);
  const pct = Math.max(0, Math.min(100, (100 * step) / job.steps));
  return `<div class="pbar${job.state === "running" ? " live" : ""}"><div class="fill" style="width:${pct.toFixed(1)}%;--c:${colour(job.id)}"></div></div>`
    + `<span class="steps">${esc(step)} / ${esc(job.steps)}</span>`;
}

function etaCell(job, p, forecastEnds) {
  const t = now();
  if (job.state === "running" || job.state === "suspending") {
    if (p.eta == null) return '<span class="muted">—</span>';
    const mark = p.estimated ? '<span class="approx" title="estimated by this page from the steps between polls">≈</span>' : "";
    return `<span title="ends at ${esc(wallClock(p.end))}">${mark}${esc(duration(p.eta))}</span>`;
  }
  if (WAITING.has(job.state)) {
    const f = forecastEnds.get(job.id);
    if (f && f.start_at != null) {
      return `<span class="muted" title="forecast: starts ${esc(wallClock(f.start_at))}, ends ${esc(wallClock(f.end_at))}">starts in ${esc(duration(f.start_at - t))}</span>`;
    }
    return '<span class="muted">waits</span>';
  }
  if (job.state === "done" && job.started_at && job.finished_at) {
    return `<span class="muted" title="from its first start to its end">took ${esc(duration(job.finished_at - job.started_at))}</span>`;
  }
  if (job.state === "failed") return `<span class="bad">exit ${esc(job.exit_code ?? "?")}</span>`;
  return '<span class="muted">—</span>';
}

function renderJobs(t0, forecastEnds) {
  const { jobs } = ui.data;
  const body = $("jobs");
  if (!jobs.length) {
    body.innerHTML = '<tr><td colspan="7" class="empty">No jobs yet: <code>marble submit …</code></td></tr>';
    $("jobs-note").textContent = "";
    return;
  }
  const last = lastRuns();
  body.innerHTML = jobs.map((job) => {
    const p = progressOf(job, forecastEnds);
    const sub = [job.model && job.name ? job.model : null,
      job.suspensions ? `suspended ${job.suspensions}×` : null,
      job.failures ? `failed ${job.failures}×` : null,
      job.after && job.after.length ? `after #${job.after.join(", #")}` : null].filter(Boolean);
    const r = p.rate == null ? "—" : `${p.estimated && job.rate == null ? '<span class="approx">≈</span>' : ""}${rate(p.rate)}<span class="unit">/s</span>`;
    return `<tr data-job-id="${job.id}" class="${ui.selected === job.id ? "selected" : ""}">`
      + `<td class="num id">${job.id}</td>`
      + `<td class="job"><div class="jobcell">${swatch(job.id, job.role)}<div>`
      + `<span class="name">${esc(jobLabel(job))}</span>`
      + (sub.length ? `<span class="sub">${esc(sub.join(" · "))}</span>` : "") + "</div></div></td>"
      + `<td class="state">${badge(job.state)}${job.role && !FINAL.has(job.state) ? `<span class="role">${esc(job.role)}</span>` : ""}</td>`
      + `<td class="gpus">${gpusText(job, last.get(job.id))}</td>`
      + `<td class="progress-col">${progressCell(job)}</td>`
      + `<td class="num">${r}</td>`
      + `<td class="num">${etaCell(job, p, forecastEnds)}</td></tr>`;
  }).join("");
  const running = jobs.filter((j) => j.state === "running").length;
  const done = jobs.filter((j) => FINAL.has(j.state)).length;
  const all = Object.values(ui.data.status.jobs || {}).reduce((a, b) => a + b, 0);
  const older = all > jobs.length
    ? ` · ${all - jobs.length} more ended over ${duration(ui.window)} ago (marble status --all)` : "";
  $("jobs-note").textContent = `${jobs.length} jobs · ${running} running · ${done} ended${older} · FIFO order`;
}

function renderQueue(forecastEnds) {
  const waiting = ui.data.jobs.filter((j) => WAITING.has(j.state));
  const t = now();
  $("queue-note").textContent = waiting.length ? `${waiting.length} waiting, FIFO` : "";
  if (!waiting.length) {
    $("queue").innerHTML = '<li class="empty">No job waits.</li>';
    return;
  }
  $("queue").innerHTML = waiting.map((job, i) => {
    const f = forecastEnds.get(job.id);
    const facts = [
      `wants ${job.gpus_request === "auto" ? `${job.demand ?? "?"} GPUs (auto)` : `${job.gpus_request} GPUs`}`,
      job.after && job.after.length ? `after #${job.after.join(", #")}` : null,
      job.not_before && job.not_before > t ? `not before ${wallClock(job.not_before)}` : null,
      job.state === "suspended" ? `checkpoint at step ${job.step ?? 0}` : null,
      f && f.start_at != null ? `starts in ≈ ${duration(f.start_at - t)}` : null,
    ].filter(Boolean);
    return `<li data-job-id="${job.id}" class="${ui.selected === job.id ? "selected" : ""}">`
      + `<span class="pos">${i + 1}</span>${swatch(job.id, null)}`
      + `<span class="name">#${job.id} ${esc(jobLabel(job))}</span>${badge(job.state)}`
      + `<span class="sub">${esc(facts.join(" · "))}</span></li>`;
  }).join("");
}

function eventData(data) {
  if (data == null) return "";
  if (typeof data !== "object") return `<span class="kv">${esc(data)}</span>`;
  return Object.entries(data).filter(([k]) => k !== "phases").map(([k, v]) => {
    let text = typeof v === "object" && v !== null ? JSON.stringify(v) : String(v);
    if (typeof v === "number" && !Number.isInteger(v)) text = v.toFixed(3);
    if (text.length > 90 || text.includes("\n")) {
      return `<details class="kv"><summary>${esc(k)}</summary><pre>${esc(text)}</pre></details>`;
    }
    return `<span class="kv"><i>${esc(k)}</i> ${esc(text)}</span>`;
  }).join("");
}

function renderDetail(t0) {
  const el = $("detail");
  if (ui.selected == null) {
    el.innerHTML = '<p class="empty">Click a job or a bar to see its runs and events.</p>';
    return;
  }
  const d = ui.detail;
  if (!d || d.id !== ui.selected) {
    el.innerHTML = `<p class="empty">Loading job ${esc(ui.selected)}…</p>`;
    return;
  }
  const scroller = el.querySelector(".events");
  const keep = scroller ? scroller.scrollTop : null;
  const t = now();
  const listed = ui.data.jobs.find((j) => j.id === d.id) || d;
  const p = progressOf(listed, new Map(((ui.forecast && ui.forecast.jobs) || []).map((f) => [f.id, f])));
  const facts = [
    ["model", d.model || "—"],
    ["steps", d.steps ? `${d.state === "done" ? d.steps : (listed.step ?? 0)} / ${d.steps}` : (d.step ?? "—")],
    ["GPUs", d.gpus && d.gpus.length ? `${d.gpus.join(", ")} on ${d.node}` : "—"],
    ["wants", d.want ? d.want.text : "—"],
    ["rate", p.rate == null ? "—" : `${p.estimated && d.rate == null ? "≈ " : ""}${rate(p.rate)} steps/s${d.rate_source ? ` (${d.rate_source})` : ""}`],
    ["ends", p.end == null ? "—" : `${wallClock(p.end)} (in ${duration(p.eta)})`],
    ["submitted", `${wallClock(d.submitted_at)}`],
    ["started", wallClock(d.started_at)],
    ["finished", d.finished_at ? `${wallClock(d.finished_at)}${d.exit_code != null ? `, exit ${d.exit_code}` : ""}` : "—"],
    ["suspensions", d.suspensions ?? 0],
    ["failures", `${d.failures ?? 0} of ${d.retries ?? 0} retries`],
    ["after", d.after && d.after.length ? d.after.map((a) => `#${a}`).join(", ") : "—"],
    ["command", d.emulate ? "emulated job" : (d.command || []).join(" ") || "—"],
    ["directory", d.chdir || "—"],
  ];
  if (d.reason) facts.splice(8, 0, ["reason", d.reason]);
  const reasons = Array.isArray(d.reasons) && d.reasons.length ? d.reasons : d.why ? [d.why] : [];
  const runs = (d.runs || []).map((r) => `<tr data-run-id="${r.id}">`
    + `<td class="num">${r.id}</td><td>${swatch(d.id, r.role)}${esc(r.role)}</td>`
    + `<td>${esc((r.parts || [[r.node, r.gpus]]).map(([n, g]) => `${g.join(",")} @${n}`).join("; "))}${r.share > 1 ? ` (1/${r.share})` : ""}</td>`
    + `<td class="num">+${esc(clockSpan(r.started_at - t0))}</td>`
    + `<td class="num">${esc(duration((r.ended_at ?? t) - r.started_at))}</td>`
    + `<td class="num">${esc(r.start_step ?? 0)} → ${esc(r.end_step ?? (r.ended_at == null ? listed.step ?? "…" : "?"))}</td>`
    + `<td>${r.ended_at == null ? badge("running") : esc(r.end_reason || "ended")}</td></tr>`).join("");
  const events = (d.events || []).map((e) => `<li class="event">`
    + `<span class="t" title="${esc(wallClock(e.at))}">+${esc(clockSpan(e.at - t0))}</span>`
    + `<span class="kind k-${esc(e.kind)}">${esc(e.kind)}</span>`
    + `${e.run_id != null ? `<span class="run">run ${esc(e.run_id)}</span>` : ""}`
    + `<span class="data">${eventData(e.data)}</span></li>`).join("");
  const head = `<div class="detail-head">${swatch(d.id, d.role)}<h2>#${d.id} ${esc(jobLabel(d))}</h2>`
    + `${badge(d.state)}${d.role && !FINAL.has(d.state) ? `<span class="role">${esc(d.role)}</span>` : ""}`
    + '<button class="close" data-close title="close">×</button></div>' + tabs();
  if (ui.tab === "log") {
    renderLog(el, d, head);
    return;
  }
  el.innerHTML = head
    + (reasons.length ? `<ul class="why">${reasons.map((r) => `<li>${esc(r)}</li>`).join("")}</ul>` : "")
    + `<dl class="facts">${facts.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join("")}</dl>`
    + `<h3>Runs <span class="note">${(d.runs || []).length}</span></h3>`
    + (runs ? `<table class="runs"><thead><tr><th class="num">Run</th><th>Role</th><th>GPUs</th><th class="num">Start</th><th class="num">Took</th><th class="num">Steps</th><th>Ended</th></tr></thead><tbody>${runs}</tbody></table>` : '<p class="empty">No run yet.</p>')
    + `<h3>Events <span class="note">${(d.events || []).length}</span></h3>`
    + `<ol class="events">${events}</ol>`;
  const events2 = el.querySelector(".events");
  if (events2 && keep != null) events2.scrollTop = keep;
}

/* ---------- the log tab: the tail of the latest run's output, as `marble logs` ---------- */

function logPath(jobId) {
  return `jobs/${jobId}/log?stream=${ui.logStream}&tail=${LOG_LINES}&limit=${LOG_BYTES}`;
}

function fetchLog() {
  const jobId = ui.selected;
  if (jobId == null || ui.tab !== "log") return;
  api(logPath(jobId)).then((log) => {
    if (ui.selected === jobId && ui.tab === "log") { ui.log = log; render(); }
  }).catch(() => { /* the next poll tries again */ });
}

function tabs() {
  return '<div class="tabs" role="tablist">' + [["details", "Details"], ["log", "Log"]].map(([k, label]) =>
    `<button role="tab" class="tab${ui.tab === k ? " on" : ""}" data-tab="${k}" aria-selected="${ui.tab === k}">${label}</button>`).join("")
    + "</div>";
}

function runHeader(r) {  // the header `marble logs` prints for a run
  const ended = r.ended_at != null;
  const gpus = `${r.gpus.length} GPU${r.gpus.length === 1 ? "" : "s"}`;
  const steps = r.end_step != null ? `, steps ${r.start_step} → ${r.end_step}`
    : r.start_step ? `, from step ${r.start_step}` : "";
  return `run ${r.id} (job ${r.job_id}): ${r.role}, ${gpus} on ${r.node}${steps}, `
    + `${ended ? r.end_reason || "ended" : "running"}`;
}

function renderLog(el, d, head) {
  const old = el.querySelector("pre.log");
  const following = !old || old.scrollTop + old.clientHeight >= old.scrollHeight - 4;
  const keep = old ? old.scrollTop : 0;
  const log = ui.log && ui.log.job_id === d.id && ui.log.stream === ui.logStream ? ui.log : null;
  const streams = ["stdout", "stderr"].map((s) =>
    `<button class="stream${s === ui.logStream ? " on" : ""}" data-stream="${s}">${s}</button>`).join("");
  let body = '<p class="empty">Loading the log…</p>';
  if (log && !log.run) body = `<p class="empty">No run yet (${esc(log.state)}).</p>`;
  else if (log) {
    const notes = [runHeader(log.run)];
    if (log.offset > 0) notes.push(`its last ${LOG_LINES} lines`);
    if (log.runs.length > 1) notes.push(`${log.runs.length} runs: marble logs ${d.id} --all-runs`);
    body = `<div class="log-run">${esc(notes.join(" · "))}</div>`
      + `<pre class="log">${esc(log.text) || '<span class="muted">(nothing yet)</span>'}</pre>`;
  }
  el.innerHTML = head + `<div class="log-bar">${streams}`
    + '<span class="note">the latest run, followed while this tab is open</span></div>' + body;
  const pre = el.querySelector("pre.log");
  if (pre) pre.scrollTop = following ? pre.scrollHeight : keep;
}

/* ---------- interaction ---------- */

function select(jobId) {
  if (ui.selected === jobId) return;
  ui.selected = jobId;
  ui.detail = null;
  ui.log = null;
  render();
  if (jobId != null) {
    api(`jobs/${jobId}`).then((d) => {
      if (ui.selected === jobId) { ui.detail = d; render(); }
    }).catch(() => { /* the next poll tries again */ });
    fetchLog();
  }
}

document.addEventListener("click", (event) => {
  if (event.target.closest("[data-close]")) { select(null); return; }
  const tab = event.target.closest("[data-tab]");
  const stream = event.target.closest("[data-stream]");
  if (tab || stream) {
    if (tab) ui.tab = tab.dataset.tab;
    if (stream) ui.logStream = stream.dataset.stream;
    ui.log = null;
    render();
    fetchLog();
    return;
  }
  if (event.target.closest("details, summary")) return;
  const hit = event.target.closest("[data-job-id]");
  if (hit) select(Number(hit.dataset.jobId));
});

document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") select(null);
});

window.addEventListener("hashchange", () => {  // a new #token=... pasted into this page
  const token = takeToken();
  if (token && token !== ui.token) {
    ui.token = token;
    clearTimeout(ui.timer);
    poll();
  }
});

let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(render, 100);
});

ui.token = takeToken();
ui.window = windowFromAddress();
poll();
