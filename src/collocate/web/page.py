"""The dashboard page: one self-contained HTML document (inline CSS and JS, no CDN, no build).

Why a Python string: it ships inside the wheel with no package-data rules, and the daemon may run
on an offline server. The script polls the JSON API every ``POLL_MS`` and rebuilds the views with
DOM calls and ``textContent`` only (job names, reasons and logs are user text: never
``innerHTML``). Charts are SVG drawn here, with axes and units (no charting library to ship).
Sizes are formatted as ``collocate.common.units.format_mib`` does and times as ``YYYY-MM-DD HH:MM:SS``
local time, as the CLI prints them. ``/jobs/<id>`` is the same page opened on one job.

A member keeps it open (``collocate dashboard``, their own rights): running jobs first (who is
where), then the queue in the order jobs would start with each one's reason, side by side on a
wide screen; the GPUs as a grid of cards that fills the width (charts sized to their card), each
with power, temperature and clocks (or which of them the backend cannot read: emulated GPUs
model power only) and the processes holding memory with their jobs; the host's CPU and RAM in
the header beside a count of every state the daemon returns (zeros included); a range of history
(``#range``: 2 minutes to 7 days, the monitor's retention, from ``/api/history``, polled every
``HISTORY_MS``), per GPU (SM activity; memory used beside memory committed to jobs; energy) and
per user (GPUs held, memory, energy), where a bucket without samples breaks the line (gaps are
drawn as gaps); the finished jobs paged by the server (``/api/board``, newest first); filters by
user, state and text (applied by the server); and cancel, hold and release buttons on the
viewer's own jobs (all jobs for the daemon's owner) when the source can act.

Element ids used by the browser tests: ``#counts`` (``.count[data-state]``), ``#drain``,
``#you``, ``#host``, ``#range``, ``#gpus`` (one ``.gpu`` card per GPU, ``data-uuid``, each
with ``.readings``, ``.procs`` and two ``svg.chart`` whose lines are ``polyline.line``),
``#users`` (``.user[data-user]``), ``#filter-user``, ``#filter-state``,
``#filter-text``, ``#queue``, ``#running``, ``#finished`` (with ``#finished-total``,
``#finished-page``, ``#newer``, ``#older``; rows ``tr[data-job]``, state cells
``.badge.state-<state>``, buttons ``button.act[data-action]``), ``#detail`` (``#detail-title``,
``#detail-command``, ``#attempts``, ``#stdout``, ``#stderr``), ``#tracking``, ``#act-msg``.
"""

from __future__ import annotations

POLL_MS = 1500
HISTORY_MS = 10_000  # history is bucketed over up to a day: asked for less often than the rest
# (and for long ranges less often still: range / 360, 4 min for a day, whose query took 2.1 s
# over 8 GPUs and 10 jobs sampled every second on the 2-core dev machine)

_STYLE = """
body{font:14px system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2733}
header{background:#1d2733;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center;flex-wrap:wrap}
header h1{font-size:18px;margin:0}header a{color:#fff;text-decoration:none}
#tracking{font-size:12px}#tracking.bad{color:#ffb4a8}#updated{font-size:12px;color:#c9d1da}
#counts{display:flex;gap:6px}
#drain{background:#fdf3d7;color:#6b4e00;border:1px solid #e6c65c;padding:6px 10px;border-radius:6px}
main{padding:12px 16px;display:grid;gap:16px}
section h2{font-size:15px;margin:4px 0 8px}
#gpus,#users{display:grid;grid-template-columns:repeat(auto-fill,minmax(var(--card),1fr));gap:10px}
:root{--card:320px}
.gpu,.user{background:#fff;border:1px solid #d5dae0;border-radius:6px;padding:8px;min-width:0}
.readings,.procs{font-size:12px;color:#5b6775}.procs td{font-size:12px;padding:1px 6px}
#host{font-size:12px;color:#c9d1da}.pager{display:flex;gap:8px;align-items:center;margin:6px 0}
.jobs{display:grid;grid-template-columns:repeat(auto-fit,minmax(640px,1fr));gap:16px;align-items:start}
.name{font-weight:600}.sub{color:#5b6775;font-size:12px}
.bar{height:10px;background:#e4e8ec;border-radius:5px;overflow:hidden;margin:4px 0}
.bar div{height:100%;background:#3a7bd5}.bar div.hot{background:#d55b3a}
svg.chart{display:block;margin-top:4px}svg.chart text{font-size:10px;fill:#5b6775}
svg.chart .axis{stroke:#9aa5b1;stroke-width:1}svg.chart .grid{stroke:#e4e8ec;stroke-width:1}
svg.chart polyline{fill:none;stroke-width:1.5}
table{border-collapse:collapse;background:#fff;width:100%}
th,td{border-bottom:1px solid #e4e8ec;padding:4px 8px;text-align:left;font-size:13px;vertical-align:top}
th{color:#5b6775;font-weight:600}
tr[data-job]{cursor:pointer}tr[data-job]:hover{background:#eef3fb}tr[data-job].sel{background:#e3ecfa}
td a{color:#1a5fb4}.reason{color:#5b6775;max-width:520px}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;font-size:12px;font-weight:600;color:#fff;background:#6b7480}
.state-pending{background:#b7791f}.state-running{background:#1a5fb4}.state-done{background:#2e7d32}
.state-failed{background:#b3261e}.state-cancelled{background:#6b7480}.state-rejected{background:#7a1f5c}
.state-timeout{background:#8a3b12}.state-suspended{background:#5b4bb7}
.bar div.committed{background:#e6a23c}.legend{font-size:11px;color:#5b6775}
.filters{display:flex;gap:8px;margin:0 0 6px}
button.act{font-size:11px;padding:1px 6px;margin-right:3px}#act-msg.err{color:#b3261e}
select,.filters input{padding:2px 4px}
#detail{background:#fff;border:1px solid #d5dae0;border-radius:6px;padding:8px}
#detail pre{background:#10161d;color:#d8dee6;padding:8px;max-height:260px;overflow:auto;white-space:pre-wrap}
.charts{display:flex;flex-wrap:wrap;gap:12px}
form{display:flex;gap:6px;flex-wrap:wrap}form input{padding:3px 6px}#submit-msg.err{color:#b3261e}
"""

_BODY = """
<header><h1><a href="/">collocate</a></h1><span id="counts"></span>
<span id="you"></span><label>history <select id="range">
<option value="120">2 min</option><option value="600" selected>10 min</option>
<option value="3600">1 h</option><option value="21600">6 h</option><option value="86400">24 h</option>
<option value="259200">3 d</option><option value="604800">7 d</option>
</select></label><span id="host"></span><span id="updated">loading...</span><span id="tracking"></span></header>
<main>
<div id="drain" hidden>draining: the daemon places no new jobs (running ones go on);
<code>collocate resume</code> places jobs again</div>
<section id="detail-box" hidden><h2>Job</h2><div id="detail"></div></section>
<div class="filters"><input id="filter-user" placeholder="user"><select id="filter-state">
<option value="">any state</option></select>
<input id="filter-text" placeholder="name, id or reason contains"><span id="act-msg"></span></div>
<div class="jobs"><section><h2>Running</h2><table id="running"></table></section>
<section><h2>Queue (in the order jobs start)</h2><table id="queue"></table></section></div>
<section><h2>GPUs</h2><div id="gpus"></div></section>
<section id="users-box" hidden><h2>Users</h2><div id="users"></div></section>
<section id="submit-box" hidden><h2>Submit</h2>
<form id="submit"><input id="cmd" placeholder="command, e.g. python train.py --tag 'run 1'" size="50">
<input id="mem" placeholder="memory, e.g. 6GiB" size="12"><input id="jobname" placeholder="name">
<button>submit</button><span id="submit-msg"></span></form></section>
<section><h2>Finished <span class="sub" id="finished-total"></span></h2>
<div class="pager"><button id="newer">newer</button><span id="finished-page"></span>
<button id="older">older</button></div><table id="finished"></table></section>
</main>
"""

_SCRIPT = r"""
"use strict";
const POLL_MS = __POLL_MS__, HISTORY_MS = __HISTORY_MS__, NS = "http://www.w3.org/2000/svg";
const token = new URLSearchParams(location.search).get("token");
if (token) history.replaceState(null, "", location.pathname);  // the cookie carries it now
const jobInPath = () => { const m = location.pathname.match(/^\/jobs\/([^/]+)$/); return m ? decodeURIComponent(m[1]) : null; };
let selected = jobInPath();

async function api(path, init) {
  init = init || {};
  init.headers = Object.assign({}, init.headers || {}, token ? {"X-Collocate-Token": token} : {});
  const r = await fetch(path, init);
  if (!r.ok) {
    let detail = "";
    try { detail = (await r.json()).detail || ""; } catch (e) {}
    throw new Error(detail || (path + ": HTTP " + r.status));
  }
  return r.json();
}
function el(tag, attrs, ...kids) {  // user text only ever becomes text nodes
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("data-") || k === "href") e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
const none = x => x === null || x === undefined;
const fmt = (x, d) => none(x) ? "-" : Number(x).toFixed(d === undefined ? 0 : d);
const pct = x => none(x) ? "-" : Math.round(100 * x) + "%";
const mib = x => none(x) ? "-" : x >= 1024 ? (x / 1024).toFixed(2) + " GiB" : Math.round(x) + " MiB";
const pad = n => String(n).padStart(2, "0");
const clock = d => pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
const when = t => { if (!t) return "-"; const d = new Date(t * 1000);
  return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + clock(d); };

// A line chart with a time axis and a labelled y axis: points are [t (epoch s), value].
function chart(series, o) {
  const w = o.w || 280, h = o.h || 100, L = 62, R = 8, T = 24, B = 18;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "chart"); svg.setAttribute("width", w); svg.setAttribute("height", h);
  const add = (tag, attrs, text) => { const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text; svg.append(e); return e; };
  add("text", {x: 0, y: 10}, o.title);
  const pts = [];
  for (const s of series) for (const p of s.points) if (!none(p[1])) pts.push(p);
  if (!pts.length) { add("text", {x: L, y: h / 2}, "no samples yet"); return svg; }
  const all = series.flatMap(s => s.points);  // the time axis spans the range, gaps included
  const t0 = Math.min(...all.map(p => p[0])), t1 = Math.max(t0 + 1, ...all.map(p => p[0]));
  const top = o.max || Math.max(1e-9, ...pts.map(p => p[1])) * 1.1;
  const x = t => L + (w - L - R) * (t - t0) / (t1 - t0), y = v => h - B - (h - B - T) * Math.min(1, v / top);
  for (const v of [0, top / 2, top]) {
    add("line", {x1: L, x2: w - R, y1: y(v), y2: y(v), "class": v ? "grid" : "axis"});
    add("text", {x: L - 4, y: y(v) + 3, "text-anchor": "end"}, o.fmt(v));
  }
  add("line", {x1: L, x2: L, y1: T, y2: h - B, "class": "axis"});
  add("text", {x: L, y: h - 4}, clock(new Date(t0 * 1000)));
  add("text", {x: w - R, y: h - 4, "text-anchor": "end"}, clock(new Date(t1 * 1000)));
  for (const s of series) {  // a null point (nothing sampled) ends a line: gaps stay gaps
    const colour = s.color || "#2e9c5b", runs = [[]];
    for (const p of s.points) { if (none(p[1])) { if (runs[runs.length - 1].length) runs.push([]); }
                                else runs[runs.length - 1].push(p); }
    for (const run of runs.filter(r => r.length)) {
      add("polyline", {stroke: colour, "class": "line", points: run.map(p => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" ")});
      if (run.length === 1) add("circle", {cx: x(run[0][0]), cy: y(run[0][1]), r: 1.5, fill: colour});
    }
    const shown = s.points.filter(p => !none(p[1])), last = shown[shown.length - 1];
    if (last) add("circle", {cx: x(last[0]), cy: y(last[1]), r: 2.5, fill: colour});  // the latest value
  }
  return svg;
}
let usage = null, status = {}, lastHistory = 0, finishedPage = 0;  // usage: /api/history's answer
function cardWidth(id) {  // the width a grid card gets (charts fill it)
  const box = document.getElementById(id), card = 320, gap = 10, W = box.clientWidth || 1200;
  const cols = Math.max(1, Math.floor((W + gap) / (card + gap)));
  return Math.floor((W - gap * (cols - 1)) / cols) - 18;
}
const watts = x => none(x) ? null : Math.round(x) + " W";
const mhz = x => none(x) ? null : Math.round(x) + " MHz";
function readings(g) {  // what nvidia-smi shows beside memory; left out where not read
  const parts = [["power", watts(g.power_w)], ["temperature", none(g.temperature_c) ? null : Math.round(g.temperature_c) + " C"],
                 ["SM clock", mhz(g.sm_clock_mhz)], ["memory clock", mhz(g.mem_clock_mhz)]];
  const read = parts.filter(p => p[1] !== null), unread = parts.filter(p => p[1] === null).map(p => p[0]);
  return el("div", {"class": "readings"}, read.map(p => p[0] + " " + p[1]).join(" | ")
    + (unread.length ? (read.length ? " | " : "") + "not read by this backend: " + unread.join(", ") : ""));
}
function procs(g) {
  const ps = g.processes || [];
  if (!ps.length) return el("div", {"class": "procs"}, "no processes on it");
  return el("table", {"class": "procs"}, el("tr", {}, el("th", {}, "pid"), el("th", {}, "job"), el("th", {}, "memory")),
    ...ps.map(p => el("tr", {}, el("td", {}, String(p.pid)), el("td", {}, none(p.job) ? "(not a job)" : "#" + p.job),
                      el("td", {}, mib(p.used_mib)))));
}
function renderHost(h) {
  document.getElementById("host").textContent = h ? "host: CPU " + (none(h.cpu_pct) ? "-" : Math.round(h.cpu_pct) + "%")
    + " of " + h.cpus + " cores, load " + fmt(h.load1, 1) + " | RAM " + mib(h.mem_used_mib) + " / " + mib(h.mem_total_mib) : "";
}
const sum = (xs, f) => xs.reduce((a, x) => a + (f(x) || 0), 0);
const wh = x => none(x) ? "-" : x >= 1000 ? (x / 1000).toFixed(2) + " kWh" : x.toFixed(2) + " Wh";
function keepCards(id, key, fresh) {  // a card keeps its element across polls (links, screenshots)
  const box = document.getElementById(id), old = {};
  for (const c of box.children) old[c.getAttribute(key)] = c;
  box.replaceChildren(...fresh.map(card => {
    const kept = old[card.getAttribute(key)];
    if (!kept) return card;
    kept.replaceChildren(...card.childNodes);
    return kept;
  }));
}
function renderGpus(gpus) {
  const kept = {}; for (const g of (usage && usage.gpus) || []) kept[g.uuid] = g.points;
  const w = cardWidth("gpus");
  keepCards("gpus", "data-uuid", gpus.map(g => {
    const used = g.used_mib || 0, frac = g.total_mib ? used / g.total_mib : 0;
    const committed = g.committed_mib || 0, cfrac = g.total_mib ? Math.min(1, committed / g.total_mib) : 0;
    const hist = (kept[g.uuid] && kept[g.uuid].length) ? kept[g.uuid] : (g.history || []);
    const held = Object.entries(g.job_mib || {}).map(([j, m]) => "#" + j + " " + mib(m));
    const energy = kept[g.uuid] ? sum(kept[g.uuid], p => p.energy_wh) : null;
    return el("div", {"class": "gpu", "data-uuid": g.uuid},
      el("div", {"class": "name"}, g.id + " " + (g.type || "")),
      el("div", {"class": "sub"}, mib(used) + " / " + mib(g.total_mib) + " used"),
      el("div", {"class": "bar", title: "used"}, el("div", {"class": frac > 0.9 ? "hot" : "",
                                              style: "width:" + (100 * frac).toFixed(1) + "%"})),
      el("div", {"class": "sub committed-text"}, mib(committed) + " committed to jobs (what placement counts as taken)"),
      el("div", {"class": "bar", title: "committed"}, el("div", {"class": "committed",
                                              style: "width:" + (100 * cfrac).toFixed(1) + "%"})),
      el("div", {"class": "sub"}, "SM " + pct(g.util) + " | jobs: "
        + (held.join(", ") || (g.jobs || []).map(j => "#" + j).join(", ") || "none")
        + (energy === null ? "" : " | " + wh(energy) + " in range")),
      readings(g), procs(g),
      chart([{points: hist.map(p => [p.t, p.util])}], {w, title: "SM activity (%)", max: 1, fmt: v => Math.round(100 * v) + "%"}),
      chart([{points: hist.map(p => [p.t, p.used_mib]), color: "#3a7bd5"},
             {points: hist.map(p => [p.t, p.committed_mib]), color: "#e6a23c"}],
            {w, title: "memory: used (blue), committed (orange)", max: g.total_mib, fmt: mib}));
  }));
}
function renderUsers() {
  const users = (usage && usage.users) || [];
  document.getElementById("users-box").hidden = !users.length;
  const w = cardWidth("users");
  keepCards("users", "data-user", users.map(u => el("div", {"class": "user", "data-user": u.user},
    el("div", {"class": "name"}, u.user || "(daemon)"),
    el("div", {"class": "sub"}, wh(sum(u.points, p => p.energy_wh)) + " in range, up to "
       + fmt(Math.max(0, ...u.points.map(p => p.gpus || 0)), 2) + " GPUs held"),
    chart([{points: u.points.map(p => [p.t, p.gpus]), color: "#7a1f5c"}], {w, title: "GPUs held", fmt: v => v.toFixed(1)}),
    chart([{points: u.points.map(p => [p.t, p.mem_mib]), color: "#3a7bd5"}], {w, title: "GPU memory held", fmt: mib}))));
}
const shownState = j => j.suspended ? "suspended" : j.state;  // a frozen job's state stays running
const badge = j => el("span", {"class": "badge state-" + shownState(j)}, shownState(j));
const idLink = j => el("a", {href: "/jobs/" + encodeURIComponent(j.id)}, j.id);
const dur = s => { if (none(s)) return "-"; s = Math.max(0, Math.floor(s));
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), x = s % 60;
  return (d ? d + "-" + pad(h) + ":" : h ? h + ":" : "") + (d || h ? pad(m) : m) + ":" + pad(x); };
const mine = j => status.admin || (status.you && j.user === status.you);
function actions(j) {
  if (!status.can_act || !mine(j) || (j.state !== "pending" && j.state !== "running")) return "";
  const buttons = [["cancel", "cancel"]];
  if (j.state === "pending") buttons.push(j.held ? ["release", "release"] : ["hold", "hold"]);
  return el("span", {}, ...buttons.map(([action, label]) => {
    const b = el("button", {"class": "act", "data-action": action}, label);
    b.onclick = async ev => { ev.stopPropagation();
      const msg = document.getElementById("act-msg");
      try { await api("/api/jobs/" + encodeURIComponent(j.id) + "/" + action, {method: "POST"});
            msg.className = ""; msg.textContent = action + ": job " + j.id; refresh(); }
      catch (e) { msg.className = "err"; msg.textContent = e.message; } };
    return b; }));
}
const COLS = {
  pos: ["#", j => none(j.position) ? "" : String(j.position)],
  id: ["id", idLink], name: ["name", j => j.name || ""], user: ["user", j => j.user || ""],
  state: ["state", j => el("span", {}, badge(j), j.held ? " held" : "")], on: ["on", j => (j.on || []).join(", ")],
  prio: ["priority", j => String(j.priority || 0)],
  need: ["needs", j => mib(j.mem_mib)], held: ["holds now", j => mib(j.used_mib)],
  time: ["time", j => dur(none(j.elapsed_s) ? j.elapsed_s : Math.max(0, j.elapsed_s - (j.frozen_s || 0)))  // frozen: not run
               + (none(j.time_limit_s) ? "" : " / " + dur(j.time_limit_s))],
  wait: ["waited", j => dur(j.wait_s)], exit: ["exit", j => none(j.exit_code) ? "-" : String(j.exit_code)],
  submitted: ["submitted", j => when(j.submit_time)], started: ["started", j => when(j.start_time)],
  ended: ["ended", j => when(j.end_time)],
  reason: ["reason", j => el("span", {"class": "reason"}, j.reason || "")],
  act: ["", actions],
};
function renderTable(id, rows, cols) {
  const t = document.getElementById(id);
  t.replaceChildren(el("tr", {}, ...cols.map(c => el("th", {}, COLS[c][0]))), ...rows.map(j => {
    const tr = el("tr", {"data-job": j.id, "class": j.id === selected ? "sel" : ""},
                  ...cols.map(c => el("td", {}, COLS[c][1](j))));
    tr.onclick = ev => { if (ev.target.tagName !== "A" && ev.target.tagName !== "BUTTON") openJob(j.id); };
    return tr;
  }));
}
function boardQuery() {
  const q = new URLSearchParams({page: finishedPage});
  for (const [k, id] of [["user", "filter-user"], ["state", "filter-state"], ["text", "filter-text"]]) {
    const v = document.getElementById(id).value.trim(); if (v) q.set(k, v); }
  return "/api/board?" + q;
}
function renderJobs(b) {  // b: /api/board (active jobs, a page of finished ones, counts)
  const order = j => none(j.position) ? 1e9 + Number(j.id) : j.position;
  const q = b.active.filter(j => j.state === "pending").sort((a, c) => order(a) - order(c));
  const r = b.active.filter(j => j.state !== "pending");  // running, and any other live state
  finishedPage = b.page;
  renderTable("queue", q, ["pos", "id", "name", "user", "state", "prio", "need", "submitted", "reason", "act"]);
  renderTable("running", r, ["id", "name", "user", "state", "on", "need", "held", "time", "started", "reason", "act"]);
  renderTable("finished", b.finished, ["id", "name", "user", "state", "on", "time", "wait", "exit", "ended", "reason"]);
  document.getElementById("finished-total").textContent = "(" + b.finished_total + ")";
  document.getElementById("finished-page").textContent = "page " + (b.page + 1) + " of " + b.pages;
  document.getElementById("newer").disabled = b.page === 0;
  document.getElementById("older").disabled = b.page >= b.pages - 1;
  const states = Object.keys(b.counts);  // every state the daemon knows, zeros included
  const counted = JSON.stringify(b.counts), box = document.getElementById("counts");
  if (box.dataset.counted !== counted) {  // redrawn only when a count changes
    box.dataset.counted = counted;
    box.replaceChildren(...states.map(s =>
      el("span", {"class": "badge count state-" + s, "data-state": s}, b.counts[s] + " " + s)));
  }
  const pick = document.getElementById("filter-state");
  if (pick.options.length !== states.length + 1) {
    const was = pick.value;
    pick.replaceChildren(el("option", {value: ""}, "any state"), ...states.map(s => el("option", {value: s}, s)));
    pick.value = was;
  }
}
function ownCharts(metrics) {
  const byKey = new Map();
  for (const m of metrics) { if (!byKey.has(m.key)) byKey.set(m.key, []); byKey.get(m.key).push([m.t, m.value]); }
  return [...byKey.entries()].slice(0, 8).map(([key, pts]) =>
    el("div", {"class": "own", "data-key": key}, key + " (last " + Number(pts[pts.length - 1][1]).toPrecision(4) + ")",
       chart([{points: pts}], {title: key, fmt: v => Number(v).toPrecision(3)})));
}
function measuredText(s) {  // as `collocate show` says it: what was not measured says so and why
  if (none(s.peak_mib)) return "measured: nothing yet";
  if (!(s.occupancy_hours > 0) && !(s.peak_mib > 0)) return "GPU: not measured: no process of the job held GPU memory, "
    + "so it was charged no GPU time or energy (on emulated GPUs only `collocate emulate-job` processes hold any)";
  return "measured: peak " + mib(s.peak_mib) + " (any attempt) | mean SM " + (none(s.mean_sm) ? "not read" : pct(s.mean_sm))
    + " | " + fmt(s.gpu_hours, 3) + " GPU-h | "
    + (s.energy_wh > 0 ? fmt(s.energy_wh, 2) + " Wh" : "energy not measured (no power reading)");
}
function profileText(p, s) {  // an assumption is not shown beside a measurement
  if (p.source_kind === "assumed" && !none(s.mean_sm))
    return "alone: never measured (it always shared its GPU); its measured mean SM is above";
  return "alone: SM " + fmt(p.sm_activity, 2) + ", DRAM " + fmt(p.dram_activity, 2) + " (" + p.source + ")";
}
function attemptsTable(attempts) {
  const head = ["#", "started", "ended", "GPUs", "placed with", "peak", "outcome", "reason"];
  return el("table", {id: "attempts"}, el("tr", {}, ...head.map(h => el("th", {}, h))),
    ...attempts.map(a => el("tr", {}, el("td", {}, a.n), el("td", {}, when(a.start)), el("td", {}, when(a.end)),
      el("td", {}, (a.gpus || []).join(", ")), el("td", {}, mib(a.mem_mib)),
      el("td", {}, mib(a.peak_mib) + (a.peak_so_far ? " so far" : "")),
      el("td", {}, a.outcome || (a.end ? "-" : "running")), el("td", {"class": "reason"}, a.reason || ""))));
}
async function refreshDetail() {
  const boxWrap = document.getElementById("detail-box"), box = document.getElementById("detail");
  boxWrap.hidden = selected === null;
  if (selected === null) return;
  const base = "/api/jobs/" + encodeURIComponent(selected);
  try {
    const [d, out, err] = await Promise.all([api(base), api(base + "/log"), api(base + "/log?stream=stderr")]);
    const s = d.summary || {}, samples = d.samples || [];
    const series = key => [{points: samples.map(x => [x.t, x[key]])}];
    box.replaceChildren(
      el("div", {"class": "name", id: "detail-title"}, "job " + d.id + " " + (d.name || "") + " ", badge(d)),
      el("div", {"class": "sub", id: "detail-command"}, d.argv ? d.argv.map(a => /^[\w@%+=:,./-]+$/.test(a) ? a
         : "'" + a.replace(/'/g, "'\"'\"'") + "'").join(" ") : "command: only its owner sees it (collocate submit --public shares it)"),
      el("div", {"class": "reason"}, d.reason || ""),
      el("div", {}, "user " + (d.user || "-") + " | needs " + (none(d.mem_mib) ? "no memory given (charged what it holds)"
         : mib(d.mem_mib) + " (" + (d.mem_source || "-") + ")") +
         " | submitted " + when(d.submit_time) + " | ended " + when(d.end_time)),
      el("div", {id: "detail-measured"}, measuredText(s)),
      ...(d.profile ? [el("div", {"class": "sub", id: "detail-profile"}, profileText(d.profile, s))] : []),
      el("h3", {}, "attempts"), (d.attempts || []).length ? attemptsTable(d.attempts)
         : el("div", {id: "attempts", "class": "sub"}, "none yet"),  // as `show`: no header over nothing
      el("div", {"class": "charts"},
         chart(series("gpu_mib"), {title: "GPU memory", fmt: mib}),
         chart(series("sm"), {title: "SM activity (%)", max: 1, fmt: v => Math.round(100 * v) + "%"}),
         chart(series("cpu_pct"), {title: "CPU (% of one core)", fmt: v => Math.round(v) + "%"}),
         ...ownCharts(d.metrics || [])),
      el("h3", {}, "stdout (end)"), el("pre", {id: "stdout"}, out.text || "(no output yet)"),
      el("h3", {}, "stderr (end)"), el("pre", {id: "stderr"}, err.text || "(nothing on stderr)"));
  } catch (e) { box.textContent = String(e); }
}
function openJob(id) {
  selected = id;
  history.pushState(null, "", id === null ? "/" : "/jobs/" + encodeURIComponent(id));
  refresh();
}
window.onpopstate = () => { selected = jobInPath(); refresh(); };
async function refresh() {
  try {
    const [gpus, board, st] = await Promise.all([api("/api/gpus"), api(boardQuery()), api("/api/status")]);
    status = st;
    renderHost(st.host || (st.daemon && st.daemon.host));
    document.getElementById("you").textContent = st.you ? "you: " + st.you + (st.admin ? " (the daemon's owner)" : "") : "";
    const range = Number(document.getElementById("range").value);  // a day's buckets: asked for less often
    if (Date.now() - lastHistory > Math.max(HISTORY_MS, range * 1000 / 360)) {
      lastHistory = Date.now();
      try { usage = await api("/api/history?since=" + document.getElementById("range").value); }
      catch (e) { usage = null; }  // a source without history: the GPUs' own recent points
    }
    renderJobs(board); renderGpus(gpus); renderUsers();
    const bad = (st.tracking || []).filter(s => s.degraded);
    const tr = document.getElementById("tracking");
    tr.className = bad.length ? "bad" : "";
    tr.textContent = bad.length ? "tracking degraded: " + bad.map(s => s.sink + " (" + s.reason + ")").join("; ") : "";
    document.getElementById("drain").hidden = !(st.daemon && st.daemon.draining);
    document.getElementById("submit-box").hidden = !st.can_submit;
    document.getElementById("updated").textContent = "updated " + when(Date.now() / 1000);
    await refreshDetail();
  } catch (e) { document.getElementById("updated").textContent = "cannot reach the daemon: " + e.message; }
}
document.getElementById("submit").onsubmit = async ev => {
  ev.preventDefault();
  const msg = document.getElementById("submit-msg");
  try {
    const r = await api("/api/jobs", {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({command: document.getElementById("cmd").value,
                            mem: document.getElementById("mem").value.trim(),
                            name: document.getElementById("jobname").value.trim()})});
    msg.className = ""; msg.textContent = "queued job " + r.id; refresh();
  } catch (e) { msg.className = "err"; msg.textContent = e.message; }
};
for (const id of ["filter-user", "filter-state", "filter-text"])
  document.getElementById(id).oninput = () => { finishedPage = 0; refresh(); };
document.getElementById("newer").onclick = () => { finishedPage = Math.max(0, finishedPage - 1); refresh(); };
document.getElementById("older").onclick = () => { finishedPage += 1; refresh(); };
document.getElementById("range").onchange = () => { lastHistory = 0; refresh(); };
refresh();
setInterval(refresh, POLL_MS);
"""

PAGE = ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>collocate</title>\n<style>{_STYLE}</style></head>\n<body>{_BODY}"
        f"<script>{_SCRIPT.replace('__POLL_MS__', str(POLL_MS)).replace('__HISTORY_MS__', str(HISTORY_MS))}"
        "</script></body></html>\n")
