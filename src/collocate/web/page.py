"""The dashboard page: one self-contained HTML document (inline CSS and JS, no CDN, no build).

Why a Python string: it ships inside the wheel with no package-data rules, and the daemon may run
on an offline server. The script polls the JSON API every ``POLL_MS`` and rebuilds the views with
DOM calls and ``textContent`` only (job names and logs are user text: never ``innerHTML``).
Element ids used by the browser test: ``#gpus`` (one ``.gpu`` card per GPU, ``data-uuid``),
``#queue``, ``#running``, ``#finished`` (rows ``tr[data-job]``), ``#detail``, ``#tracking``.
"""

from __future__ import annotations

POLL_MS = 1500

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>collocate</title>
<style>
body{font:14px system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2733}
header{background:#1d2733;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header h1{font-size:18px;margin:0}#tracking{font-size:12px}#tracking.bad{color:#ffb4a8}
main{padding:12px 16px;display:grid;gap:16px}
section h2{font-size:15px;margin:4px 0 8px}
#gpus{display:flex;flex-wrap:wrap;gap:10px}
.gpu{background:#fff;border:1px solid #d5dae0;border-radius:6px;padding:8px;width:230px}
.gpu .name{font-weight:600}.gpu .sub{color:#5b6775;font-size:12px}
.bar{height:10px;background:#e4e8ec;border-radius:5px;overflow:hidden;margin:4px 0}
.bar div{height:100%;background:#3a7bd5}.bar div.hot{background:#d55b3a}
svg{display:block}svg polyline{fill:none;stroke:#2e9c5b;stroke-width:1.5}
table{border-collapse:collapse;background:#fff;width:100%}
th,td{border-bottom:1px solid #e4e8ec;padding:4px 8px;text-align:left;font-size:13px}
tr[data-job]{cursor:pointer}tr[data-job]:hover{background:#eef3fb}
.state-failed{color:#b3261e}.state-done{color:#2e7d32}.state-running{color:#1a5fb4}
#detail{background:#fff;border:1px solid #d5dae0;border-radius:6px;padding:8px}
#detail pre{background:#10161d;color:#d8dee6;padding:8px;max-height:260px;overflow:auto}
.charts{display:flex;flex-wrap:wrap;gap:12px}.charts div{font-size:12px;color:#5b6775}
form{display:flex;gap:6px;flex-wrap:wrap}form input{padding:3px 6px}
</style></head>
<body>
<header><h1>collocate</h1><span id="updated">loading...</span><span id="tracking"></span></header>
<main>
<section><h2>GPUs</h2><div id="gpus"></div></section>
<section id="submit-box" hidden><h2>Submit</h2>
<form id="submit"><input id="cmd" placeholder="command, e.g. python train.py --lr 3e-4" size="50">
<input id="mem" placeholder="memory, e.g. 6GiB" size="12"><input id="jobname" placeholder="name">
<button>submit</button><span id="submit-msg"></span></form></section>
<section><h2>Queue</h2><table id="queue"></table></section>
<section><h2>Running</h2><table id="running"></table></section>
<section><h2>Finished</h2><table id="finished"></table></section>
<section><h2>Job</h2><div id="detail">click a job</div></section>
</main>
<script>
"use strict";
const POLL_MS = __POLL_MS__;
const token = new URLSearchParams(location.search).get("token");
if (token) history.replaceState(null, "", location.pathname);  // the cookie carries it now
let selected = null;

async function api(path, init) {
  init = init || {};
  init.headers = Object.assign({}, init.headers || {}, token ? {"X-Collocate-Token": token} : {});
  const r = await fetch(path, init);
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
const fmt = (x, d) => x === null || x === undefined ? "-" : Number(x).toFixed(d === undefined ? 0 : d);
const pct = x => x === null || x === undefined ? "-" : Math.round(100 * x) + "%";
const when = t => t ? new Date(t * 1000).toLocaleTimeString() : "-";
function spark(values, w, h, max) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h);
  const vs = values.filter(v => v !== null && v !== undefined);
  const top = max || Math.max(1e-9, ...vs);
  const pts = values.map((v, i) => [i * w / Math.max(1, values.length - 1),
                                    h - 1 - (h - 2) * Math.min(1, (v || 0) / top)]);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", pts.map(p => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" "));
  svg.append(line);
  return svg;
}
function renderGpus(gpus) {
  const box = document.getElementById("gpus");
  box.replaceChildren(...gpus.map(g => {
    const used = g.used_mib || 0, frac = g.total_mib ? used / g.total_mib : 0;
    return el("div", {"class": "gpu", "data-uuid": g.uuid},
      el("div", {"class": "name"}, g.id + " " + (g.type || "")),
      el("div", {"class": "sub"}, fmt(used) + " / " + fmt(g.total_mib) + " MiB"),
      el("div", {"class": "bar"}, el("div", {"class": frac > 0.9 ? "hot" : "",
                                              style: "width:" + (100 * frac).toFixed(1) + "%"})),
      el("div", {"class": "sub"}, "util " + pct(g.util) + " | jobs: " + ((g.jobs || []).map(j => "#" + j).join(", ") || "none")),
      spark(g.history || [], 210, 30, 1));
  }));
}
function jobRow(j, cols) {
  const tr = el("tr", {"data-job": j.id}, ...cols.map(c => el("td", c === "state" ? {"class": "state-" + j.state} : {}, c(j))));
  tr.onclick = () => { selected = j.id; refreshDetail(); };
  return tr;
}
function renderTable(id, rows, heads, cols) {
  const t = document.getElementById(id);
  t.replaceChildren(el("tr", {}, ...heads.map(h => el("th", {}, h))),
                    ...rows.map(j => jobRow(j, cols)));
}
const C = {id: j => j.id, name: j => j.name || "", user: j => j.user || "", state: j => j.state,
  on: j => (j.on || []).join(", "), mem: j => fmt(j.mem_mib), submitted: j => when(j.submit_time),
  started: j => when(j.start_time), ended: j => when(j.end_time), reason: j => j.reason || ""};
function renderJobs(jobs) {
  const q = jobs.filter(j => j.state === "pending"), r = jobs.filter(j => j.state === "running");
  const f = jobs.filter(j => j.state !== "pending" && j.state !== "running").reverse().slice(0, 50);
  renderTable("queue", q, ["id", "name", "user", "mem MiB", "submitted"], [C.id, C.name, C.user, C.mem, C.submitted]);
  renderTable("running", r, ["id", "name", "user", "on", "mem MiB", "started", "note"], [C.id, C.name, C.user, C.on, C.mem, C.started, C.reason]);
  renderTable("finished", f, ["id", "name", "user", "state", "ended", "reason"], [C.id, C.name, C.user, C.state, C.ended, C.reason]);
}
function ownCharts(metrics) {
  const byKey = new Map();
  for (const m of metrics) { if (!byKey.has(m.key)) byKey.set(m.key, []); byKey.get(m.key).push(m.value); }
  return [...byKey.entries()].slice(0, 8).map(([key, values]) =>
    el("div", {"class": "own", "data-key": key}, key + " (last " + Number(values[values.length - 1]).toPrecision(4) + ")",
       spark(values, 260, 50)));
}
async function refreshDetail() {
  if (selected === null) return;
  const box = document.getElementById("detail");
  try {
    const [d, log] = await Promise.all([api("/api/jobs/" + encodeURIComponent(selected)),
                                        api("/api/jobs/" + encodeURIComponent(selected) + "/log")]);
    const s = d.summary || {}, samples = d.samples || [];
    const chart = (label, key, max) => el("div", {}, label, spark(samples.map(x => x[key]), 260, 50, max));
    box.replaceChildren(
      el("div", {"class": "name", id: "detail-title"}, "job " + d.id + " " + (d.name || "") + " (" + d.state + ")"),
      el("div", {"class": "sub"}, (d.argv || []).join(" ")),
      el("div", {}, "peak " + fmt(s.peak_mib) + " MiB | mean SM " + pct(s.mean_sm) +
         " | " + fmt(s.gpu_hours, 3) + " GPU-h | " + fmt(s.energy_wh, 2) + " Wh"),
      ...(d.profile ? [el("div", {"class": "sub", id: "detail-profile"}, "alone: SM " +
         fmt(d.profile.sm_activity, 2) + ", DRAM " + fmt(d.profile.dram_activity, 2) +
         " (" + d.profile.source + ")")] : []),
      el("div", {"class": "charts"}, chart("GPU memory (MiB)", "gpu_mib"), chart("SM activity", "sm", 1),
         chart("CPU %", "cpu_pct"), ...ownCharts(d.metrics || [])),
      el("pre", {}, log.text || "(no output yet)"));
  } catch (e) { box.textContent = String(e); }
}
async function refresh() {
  try {
    const [gpus, jobs, st] = await Promise.all([api("/api/gpus"), api("/api/jobs"), api("/api/status")]);
    renderGpus(gpus); renderJobs(jobs);
    const bad = (st.tracking || []).filter(s => s.degraded);
    const tr = document.getElementById("tracking");
    tr.className = bad.length ? "bad" : "";
    tr.textContent = bad.length ? "tracking degraded: " + bad.map(s => s.sink + " (" + s.reason + ")").join("; ") : "";
    document.getElementById("submit-box").hidden = !st.can_submit;
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    await refreshDetail();
  } catch (e) { document.getElementById("updated").textContent = "cannot reach the daemon: " + e; }
}
document.getElementById("submit").onsubmit = async ev => {
  ev.preventDefault();
  const argv = document.getElementById("cmd").value.trim().split(/\\s+/).filter(Boolean);
  const msg = document.getElementById("submit-msg");
  try {
    const r = await api("/api/jobs", {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({argv, mem: document.getElementById("mem").value.trim(),
                            name: document.getElementById("jobname").value.trim()})});
    msg.textContent = "queued job " + r.id; refresh();
  } catch (e) { msg.textContent = String(e); }
};
refresh();
setInterval(refresh, POLL_MS);
</script></body></html>
""".replace("__POLL_MS__", str(POLL_MS))
