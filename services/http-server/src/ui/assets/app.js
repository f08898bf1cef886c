// The node page. No library, no network but this server: every URL is relative to
// /ui/, so the page works on port 10250 and through the API server's node proxy alike.
"use strict";

const REFRESH_MS = 5000;
const view = () => document.getElementById("view");
let timer = null;
let generation = 0;

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

// A request the server does not answer in this long is given up (the page says so and
// tries again at the next refresh) rather than holding every later refresh back.
const ANSWER_MS = 20000;

async function get(url, asText) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), ANSWER_MS);
  try {
    const r = await fetch(url, { credentials: "same-origin", cache: "no-store", signal: abort.signal });
    if (!r.ok) {
      const body = await r.text();
      const err = new Error(`${url}: ${r.status} ${body.trim()}`);
      err.status = r.status;
      throw err;
    }
    return await (asText ? r.text() : r.json());
  } catch (e) {
    if (e.name === "AbortError") throw new Error(`${url}: no answer in ${ANSWER_MS / 1000} s`);
    throw e;
  } finally {
    clearTimeout(timer);
  }
}

// Data the user may not be allowed (the history needs `nodes/stats`, a pod's details
// `nodes/pods`, as on their own paths): on a 403 its card says why; the rest of the page
// shows. Any other failure (the network, a timeout, a 5xx) fails the whole refresh, so the
// page keeps what it showed (and what the user opened or scrolled) and says it is stale.
function optional(url) {
  return get(url).catch((e) => {
    if (e.status === 403) return { denied: e.message };
    throw e;
  });
}
function deniedCard(d) {
  return `<p class="bad denied">${esc(d.denied)}</p>`;
}

function setLive(ok, why) {
  const el = document.getElementById("live");
  el.textContent = ok ? "live · " + new Date().toLocaleTimeString() : "stale: " + why;
  el.classList.toggle("stale", !ok);
}

// Quantities as kubectl prints them.
function bytes(n) {
  if (n == null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : Math.round(n)) + " " + units[i];
}
function cores(nano) {
  if (nano == null) return "–";
  const m = nano / 1e6;
  return m >= 1000 ? (m / 1000).toFixed(2) + " cores" : m.toFixed(1) + "m";
}
function rate(b) { return b == null ? "–" : bytes(b) + "/s"; }

// kubectl's age: the two largest units.
function age(since) {
  if (!since) return "–";
  let s = Math.max(0, Math.floor((Date.now() - Date.parse(since)) / 1000));
  if (s < 120) return s + "s";
  let m = Math.floor(s / 60);
  if (m < 10) return m + "m" + (s % 60) + "s";
  if (m < 180) return m + "m";
  let h = Math.floor(m / 60);
  if (h < 8) return h + "h" + (m % 60) + "m";
  if (h < 48) return h + "h";
  const d = Math.floor(h / 24);
  return d < 8 ? d + "d" + (h % 24) + "h" : d + "d";
}

function table(headers, rows, rowAttrs) {
  const head = headers.map((h) => `<th>${esc(h)}</th>`).join("");
  const body = rows.map((r, i) =>
    `<tr ${rowAttrs ? rowAttrs(i) : ""}>` + r.map((c) => `<td>${c}</td>`).join("") + "</tr>").join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

// ---- graphs ----------------------------------------------------------------------

const COLORS = ["#2b5fd9", "#e8710a", "#1e8e3e", "#9334e6", "#c5221f", "#12b5cb"];

// lines: [{label, points: [[tMs, value], ...]}]
function drawGraph(canvas, lines, fmt, floor) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 300, h = canvas.clientHeight || 140;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const g = canvas.getContext("2d");
  g.scale(dpr, dpr);
  g.clearRect(0, 0, w, h);
  const all = lines.flatMap((l) => l.points);
  canvas.dataset.points = String(all.length);
  const pad = { l: 56, r: 8, t: 8, b: 18 };
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#6b7385";
  if (!all.length) {
    g.fillText("no data yet", pad.l, h / 2);
    return;
  }
  // The last hour, or less while there is less history (five minutes at least).
  const now = Date.now();
  const span = Math.min(3600e3, Math.max(300e3, now - Math.min(...all.map((p) => p[0]))));
  const t0 = now - span, t1 = now;
  // The scale's top: 10 % over the highest point, and never under `floor` (an idle pod's
  // zeros get a readable axis).
  const vmax = Math.max(Math.max(...all.map((p) => p[1])) * 1.1, floor || 1);
  const x = (t) => pad.l + ((t - t0) / (t1 - t0)) * (w - pad.l - pad.r);
  const y = (v) => h - pad.b - (v / vmax) * (h - pad.t - pad.b);
  g.strokeStyle = "#e2e5eb";
  g.lineWidth = 1;
  for (let i = 0; i <= 3; i++) {
    const v = (vmax * i) / 3, yy = y(v);
    g.beginPath(); g.moveTo(pad.l, yy); g.lineTo(w - pad.r, yy); g.stroke();
    g.fillText(fmt(v), 2, yy + 4);
  }
  g.fillText(`−${Math.round(span / 60e3)} min`, pad.l, h - 4);
  g.fillText("now", w - pad.r - 22, h - 4);
  lines.forEach((l, i) => {
    g.strokeStyle = COLORS[i % COLORS.length];
    g.fillStyle = g.strokeStyle;
    g.lineWidth = 1.5;
    g.beginPath();
    l.points.forEach((p, j) => (j ? g.lineTo(x(p[0]), y(p[1])) : g.moveTo(x(p[0]), y(p[1]))));
    g.stroke();
    if (l.points.length === 1) {
      g.beginPath(); g.arc(x(l.points[0][0]), y(l.points[0][1]), 2.5, 0, 7); g.fill();
    }
  });
}

// Counters (bytes so far) to per-second rates between points.
function rates(points, key) {
  const out = [];
  for (let i = 1; i < points.length; i++) {
    const a = points[i - 1], b = points[i];
    if (a[key] == null || b[key] == null || b[key] < a[key]) continue;
    out.push([b.t, ((b[key] - a[key]) * 1000) / Math.max(1, b.t - a.t)]);
  }
  return out;
}
function values(points, key) {
  return points.filter((p) => p[key] != null).map((p) => [p.t, p[key]]);
}

function graphCards(id) {
  return `<div class="graphs" id="${id}">` + ["cpu", "mem", "net", "fs"].map((k) =>
    `<div class="graph"><div class="title"><span>${{ cpu: "CPU", mem: "Memory (working set)", net: "Network", fs: "Filesystem used" }[k]}</span><span class="legend" data-legend="${k}"></span></div><canvas data-graph="${k}"></canvas></div>`).join("") + "</div>";
}

// series: [{label, points}] (points as the history API gives them).
function drawGraphs(id, series) {
  const root = document.getElementById(id);
  if (!root) return;
  const canvas = (k) => root.querySelector(`canvas[data-graph="${k}"]`);
  const legend = (k, text) => { root.querySelector(`[data-legend="${k}"]`).textContent = text; };
  const last = (pts, key) => { for (let i = pts.length - 1; i >= 0; i--) if (pts[i][key] != null) return pts[i][key]; return null; };
  // Each line's latest value, in its colour's order.
  const latest = (key, fmt) => series.length === 1 ? fmt(last(series[0].points, key))
    : series.map((s) => `${s.label} ${fmt(last(s.points, key))}`).join(" · ");
  drawGraph(canvas("cpu"), series.map((s) => ({ label: s.label, points: values(s.points, "cpu") })), cores, 10e6);
  legend("cpu", latest("cpu", cores));
  drawGraph(canvas("mem"), series.map((s) => ({ label: s.label, points: values(s.points, "mem") })), bytes, 1 << 20);
  legend("mem", latest("mem", bytes));
  const first = series[0] ? series[0].points : [];
  const rx = rates(first, "rx"), tx = rates(first, "tx");
  drawGraph(canvas("net"), [{ label: "rx", points: rx }, { label: "tx", points: tx }], rate, 1024);
  legend("net", `rx ${rate(rx.length ? rx[rx.length - 1][1] : null)} · tx ${rate(tx.length ? tx[tx.length - 1][1] : null)}`);
  drawGraph(canvas("fs"), series.map((s) => ({ label: s.label, points: values(s.points, "fs") })), bytes, 1 << 20);
  legend("fs", latest("fs", bytes));
}

// ---- node page -------------------------------------------------------------------

function conditionClass(c) {
  const good = c.type === "Ready" ? c.status === "True" : c.status === "False";
  return good ? "ok" : "bad";
}

async function nodePage(gen) {
  const [n, h] = await Promise.all([get("api/node"), optional("api/history")]);
  if (gen !== generation) return false;
  document.getElementById("node-name").textContent = n.nodeName;
  const node = n.node || {};
  const st = node.status || {};
  const conds = (st.conditions || []).map((c) => [
    esc(c.type), `<span class="${conditionClass(c)}">${esc(c.status)}</span>`, esc(c.reason),
    `<span class="wrap">${esc(c.message)}</span>`, esc(age(c.lastTransitionTime))]);
  const res = Object.keys(st.capacity || {}).sort().map((k) =>
    [esc(k), esc(st.capacity[k]), esc((st.allocatable || {})[k] ?? "–")]);
  const sig = (n.signals || []).map((s) => {
    const used = s.capacity ? 1 - s.available / s.capacity : 0;
    const thr = s.hard || s.soft;
    const mark = thr && s.capacity ? `<i data-threshold="${esc(thr[1])}"></i>` : "";
    const fmt = s.signal.startsWith("pid") || s.signal.includes("inodes") ? (v) => String(v) : bytes;
    return [esc(s.signal), esc(fmt(s.available)), esc(fmt(s.capacity)),
      `<span class="bar" data-used="${used.toFixed(3)}" data-thr="${thr && s.capacity ? (1 - thr[0] / s.capacity).toFixed(3) : ""}"><span></span>${mark}</span>`,
      esc(s.hard ? s.hard[1] : "–"), esc(s.soft ? s.soft[1] : "–"),
      s.met ? '<span class="bad">met</span>' : '<span class="ok">no</span>'];
  });
  const svc = (n.services || []).map((s) => [
    esc(s.name),
    s.healthy ? '<span class="ok">healthy</span>' : `<span class="bad" title="${esc(s.error)}">${esc(s.error || "unhealthy")}</span>`,
    esc(s.version ?? "–"),
    `<span class="restarts" data-from="${esc(s.restartsFrom)}" title="${s.restartsFrom === "systemd" ? "systemd's NRestarts for the unit" : "restarts seen since http-server started"}">${esc(s.restarts)}</span>`,
    esc(s.startTime ? age(new Date(s.startTime * 1000).toISOString()) : "–"),
    esc(bytes(s.residentMemoryBytes))]);
  const info = st.nodeInfo || {};
  view().innerHTML = `
    <h1>Node ${esc(n.nodeName)}</h1>
    <div class="card"><h2>Last hour</h2>${h.denied ? deniedCard(h) : graphCards("node-graphs")}</div>
    <div class="grid">
      <div class="card"><h2>Conditions</h2>${table(["Type", "Status", "Reason", "Message", "Since"], conds)}</div>
      <div class="card"><h2>Services</h2>${table(["Service", "Health", "Version", "Restarts", "Uptime", "Memory"], svc)}</div>
      <div class="card"><h2>Pressure signals</h2>${table(["Signal", "Available", "Capacity", "Used (│ threshold)", "Hard", "Soft", "Met"], sig)}</div>
      <div class="card"><h2>Capacity and allocatable</h2>${table(["Resource", "Capacity", "Allocatable"], res)}
        <table class="kv"><tbody>
        <tr><td>Kernel</td><td>${esc(info.kernelVersion)}</td></tr>
        <tr><td>OS image</td><td>${esc(info.osImage)}</td></tr>
        <tr><td>Runtime</td><td>${esc(info.containerRuntimeVersion)}</td></tr>
        <tr><td>Kubelet</td><td>${esc(info.kubeletVersion)}</td></tr>
        </tbody></table></div>
    </div>`;
  for (const bar of view().querySelectorAll(".bar")) {
    bar.firstElementChild.style.width = (Number(bar.dataset.used) * 100).toFixed(1) + "%";
    const i = bar.querySelector("i");
    if (i && bar.dataset.thr) i.style.left = (Number(bar.dataset.thr) * 100).toFixed(1) + "%";
    if (i && Number(bar.dataset.used) >= Number(bar.dataset.thr)) bar.firstElementChild.style.background = "var(--bad)";
  }
  drawGraphs("node-graphs", [{ label: "", points: h.node || [] }]);
  return true;
}

// ---- pods ------------------------------------------------------------------------

function podRow(p) {
  const st = p.status || {};
  const cs = st.containerStatuses || [];
  const ready = cs.filter((c) => c.ready).length;
  const restarts = cs.reduce((a, c) => a + (c.restartCount || 0), 0);
  const waiting = cs.map((c) => c.state && c.state.waiting && c.state.waiting.reason).find(Boolean);
  const phase = waiting || st.reason || st.phase || "Unknown";
  const cls = st.phase === "Running" && ready === cs.length ? "ok" : st.phase === "Succeeded" ? "muted" : st.phase === "Failed" || waiting ? "bad" : "warn";
  return {
    key: `${p.metadata.namespace}/${p.metadata.name} ${phase} ${st.qosClass || ""}`.toLowerCase(),
    cells: [esc(p.metadata.namespace), esc(p.metadata.name), `<span class="${cls}">${esc(phase)}</span>`,
      `${ready}/${((p.spec || {}).containers || []).length}`, esc(restarts),
      esc(age(st.startTime || p.metadata.creationTimestamp)), esc(st.qosClass || "–")],
    href: `#/pod/${encodeURIComponent(p.metadata.namespace)}/${encodeURIComponent(p.metadata.name)}`,
    uid: p.metadata.uid,
  };
}

let podFilter = "";

async function podsPage(gen) {
  const list = await get("../pods");
  if (gen !== generation) return false;
  const pods = (list.items || []).slice().sort((a, b) =>
    (a.metadata.namespace + "/" + a.metadata.name).localeCompare(b.metadata.namespace + "/" + b.metadata.name));
  const rows = pods.map(podRow);
  if (!document.getElementById("pod-filter")) {
    view().innerHTML = `<h1>Pods</h1><div class="card">
      <input type="search" id="pod-filter" placeholder="Filter by namespace, name, phase or QoS" value="${esc(podFilter)}">
      <div id="pod-table"></div></div>`;
    document.getElementById("pod-filter").addEventListener("input", (e) => {
      podFilter = e.target.value; renderPods(lastRows);
    });
  }
  lastRows = rows;
  renderPods(rows);
  return true;
}
let lastRows = [];

function renderPods(rows) {
  const f = podFilter.trim().toLowerCase();
  const shown = rows.filter((r) => !f || f.split(/\s+/).every((w) => r.key.includes(w)));
  const el = document.getElementById("pod-table");
  if (!el) return;
  el.innerHTML = table(["Namespace", "Name", "Status", "Ready", "Restarts", "Age", "QoS"],
    shown.map((r) => r.cells), (i) => `class="pod" data-uid="${esc(shown[i].uid)}" data-href="${esc(shown[i].href)}"`) +
    `<p class="muted">${shown.length} of ${rows.length} pods</p>`;
  for (const tr of el.querySelectorAll("tr.pod")) tr.addEventListener("click", () => { location.hash = tr.dataset.href; });
}

function stateText(s) {
  if (!s) return "–";
  if (s.running) return `Running since ${age(s.running.startedAt)}`;
  if (s.waiting) return `Waiting: ${s.waiting.reason || ""}${s.waiting.message ? " (" + s.waiting.message + ")" : ""}`;
  if (s.terminated) {
    const t = s.terminated;
    return `Terminated: ${t.reason || ""}, exit code ${t.exitCode}${t.signal ? ", signal " + t.signal : ""}${t.finishedAt ? ", " + age(t.finishedAt) + " ago" : ""}${t.message ? " (" + t.message + ")" : ""}`;
  }
  return "–";
}

function probeText(p) {
  if (!p) return "–";
  const how = p.httpGet ? `http-get ${p.httpGet.scheme || "HTTP"}:${p.httpGet.port}${p.httpGet.path || "/"}`
    : p.tcpSocket ? `tcp-socket :${p.tcpSocket.port}`
      : p.grpc ? `grpc :${p.grpc.port}` : p.exec ? `exec [${(p.exec.command || []).join(" ")}]` : "?";
  return `${how} delay=${p.initialDelaySeconds || 0}s timeout=${p.timeoutSeconds || 1}s period=${p.periodSeconds || 10}s #success=${p.successThreshold || 1} #failure=${p.failureThreshold || 3}`;
}

// A pod's recent traces: each span of every service on one time line (its offset and
// duration within the trace), with the trace ID an OTLP backend shows.
// `opened`: the trace IDs the user had open (null on a first render: the newest opens).
function traceBlocks(traces, opened) {
  if (!traces.length) return '<p class="muted">No recent traces.</p>';
  return traces.map((t, i) => {
    const total = Math.max(t.durationMs, 0.001);
    const rows = t.spans.map((s) => {
      const left = (100 * s.offsetMs) / total, width = Math.max(0.5, (100 * s.durationMs) / total);
      const attrs = Object.entries(s.attributes || {}).map(([k, v]) => `${k}=${v}`).join(" ");
      return [esc(s.service), `<span title="${esc(attrs)}">${esc(s.name)}</span>`,
        `<span class="span-bar${s.error ? " failed" : ""}" data-left="${left.toFixed(2)}" data-width="${width.toFixed(2)}"><span></span></span>`,
        esc(s.durationMs.toFixed(1) + " ms"), `<span class="wrap bad">${esc(s.error)}</span>`];
    });
    const open = opened ? opened.has(t.traceId) : i === 0;
    return `<details class="trace" data-trace="${esc(t.traceId)}"${open ? " open" : ""}><summary><b>${esc(t.name)}</b> · ${esc(t.durationMs.toFixed(1))} ms · ${t.spans.length} spans · ${esc(age(new Date(t.startUnixMs).toISOString()))} ago · <code class="trace-id">${esc(t.traceId)}</code></summary>
      ${table(["Service", "Span", "When", "Took", ""], rows)}</details>`;
  }).join("");
}

function placeSpanBars() {
  for (const bar of view().querySelectorAll(".span-bar")) {
    bar.firstElementChild.style.left = bar.dataset.left + "%";
    bar.firstElementChild.style.width = bar.dataset.width + "%";
  }
}

let logContainer = "";

async function podPage(gen, ns, name) {
  const list = await get("../pods");
  if (gen !== generation) return false;
  const pod = (list.items || []).find((p) => p.metadata.namespace === ns && p.metadata.name === name);
  if (!pod) {
    view().innerHTML = `<h1>Pod ${esc(ns)}/${esc(name)}</h1><p class="bad">Not on this node (no longer, or not yet).</p>`;
    return true;
  }
  const uid = pod.metadata.uid;
  const [extra, hist] = await Promise.all([optional("api/pod?uid=" + encodeURIComponent(uid)), optional("api/history?uid=" + encodeURIComponent(uid))]);
  if (gen !== generation) return false;
  const st = pod.status || {};
  const spec = pod.spec || {};
  const specs = [...(spec.initContainers || []).map((c) => [c, "init"]), ...(spec.containers || []).map((c) => [c, ""])];
  const statuses = [...(st.initContainerStatuses || []), ...(st.containerStatuses || [])];
  const crow = specs.map(([c, kind]) => {
    const s = statuses.find((x) => x.name === c.name) || {};
    return [esc(c.name) + (kind ? ` <span class="pill muted">${kind}${c.restartPolicy === "Always" ? " sidecar" : ""}</span>` : ""),
      esc(c.image), `<span class="wrap">${esc(stateText(s.state))}</span>`,
      s.ready ? '<span class="ok">true</span>' : '<span class="muted">false</span>', esc(s.restartCount ?? 0),
      `<span class="wrap">${esc(s.lastState && s.lastState.terminated ? stateText(s.lastState) : "–")}</span>`];
  });
  const probes = [];
  for (const [c] of specs) {
    for (const kind of ["startup", "liveness", "readiness"]) {
      const p = c[kind + "Probe"];
      if (!p) continue;
      const seen = (extra.probes || []).find((x) => x.container === c.name && x.kind === kind);
      const results = extra.denied ? deniedCard(extra) : seen ? seen.results.slice().reverse().map((r) =>
        `<span class="${r.outcome === "Success" ? "ok" : "bad"}">${esc(r.outcome)}</span> ${esc(age(new Date(r.unixMs).toISOString()))} ago${r.message ? " — " + esc(r.message) : ""}`).join("<br>") : '<span class="muted">no result yet</span>';
      probes.push([esc(c.name), esc(kind), `<span class="wrap">${esc(probeText(p))}</span>`, `<span class="wrap">${results}</span>`]);
    }
  }
  const mounted = extra.volumes || [];
  const vols = (spec.volumes || []).map((v) => {
    const type = Object.keys(v).find((k) => k !== "name") || "?";
    const m = mounted.find((x) => x.name === v.name);
    return [esc(v.name), esc(type), `<span class="wrap">${esc(m ? m.hostPath : "–")}</span>`];
  });
  // Without the right to list events (upstream's system:node role has none), the
  // services' own Warnings, with why.
  const evs = Array.isArray(extra.events) ? extra.events : ((extra.events || {}).warnings || []);
  const evRows = evs.map((e) => [`<span class="${e.type === "Warning" ? "warn" : ""}">${esc(e.type)}</span>`, esc(e.reason),
    esc(e.last ? age(e.last) : e.lastUnixMs ? age(new Date(e.lastUnixMs).toISOString()) : "–"), esc(e.count), esc(e.source),
    `<span class="wrap">${esc(e.message)}</span>`]);
  const names = (spec.containers || []).map((c) => c.name);
  if (!names.includes(logContainer)) logContainer = names[0] || "";
  const ready = (st.conditions || []).map((c) => `${esc(c.type)}=<span class="${c.status === "True" ? "ok" : "bad"}">${esc(c.status)}</span>`).join(" ");
  // What the user did on this pod's page before this refresh stays: the traces opened or
  // closed, the log tail scrolled back (else it follows the end).
  const again = view().dataset.pod === uid;
  const opened = again ? new Set([...view().querySelectorAll("details.trace[open]")].map((d) => d.dataset.trace)) : null;
  const oldLogs = again ? document.getElementById("logs") : null;
  const logsAt = oldLogs && oldLogs.scrollTop + oldLogs.clientHeight < oldLogs.scrollHeight - 4 ? oldLogs.scrollTop : null;
  const oldLog = oldLogs ? oldLogs.textContent : "…";
  view().dataset.pod = uid;
  view().innerHTML = `
    <h1>Pod ${esc(ns)}/${esc(name)}</h1>
    <div class="card"><table class="kv"><tbody>
      <tr><td>Phase</td><td id="pod-phase">${esc(st.phase)}${st.reason ? " (" + esc(st.reason) + ")" : ""}</td></tr>
      <tr><td>Conditions</td><td>${ready}</td></tr>
      <tr><td>UID</td><td>${esc(uid)}</td></tr>
      <tr><td>Pod IP</td><td>${esc(st.podIP || "–")}</td></tr>
      <tr><td>QoS</td><td>${esc(st.qosClass || "–")}</td></tr>
      <tr><td>Started</td><td>${esc(age(st.startTime))} ago</td></tr>
    </tbody></table></div>
    <div class="card"><h2>Containers</h2>${table(["Name", "Image", "State", "Ready", "Restarts", "Last termination"], crow)}</div>
    <div class="card"><h2>Last hour</h2>${hist.denied ? deniedCard(hist) : graphCards("pod-graphs")}</div>
    <div class="grid">
      <div class="card"><h2>Probes</h2>${probes.length ? table(["Container", "Probe", "Spec", "Recent results (newest first)"], probes) : '<p class="muted">No probes.</p>'}</div>
      <div class="card"><h2>Volumes</h2>${vols.length ? table(["Name", "Type", "On the host"], vols) : '<p class="muted">No volumes.</p>'}</div>
    </div>
    <div class="card"><h2>Events</h2>${extra.denied ? deniedCard(extra) : (extra.events && extra.events.error ? `<p class="muted">${esc(extra.events.error)}: the Warnings the services recorded follow.</p>` : "") + (evRows.length ? table(["Type", "Reason", "Last", "Count", "From", "Message"], evRows) : '<p class="muted">No events.</p>')}</div>
    <div class="card"><h2>Traces</h2>${extra.denied ? deniedCard(extra) : traceBlocks(extra.traces || [], opened)}</div>
    <div class="card"><h2>Log tail <select id="log-container">${names.map((n) => `<option${n === logContainer ? " selected" : ""}>${esc(n)}</option>`).join("")}</select></h2>
      <pre class="logs" id="logs"></pre></div>`;
  document.getElementById("log-container").addEventListener("change", (e) => { logContainer = e.target.value; route(); });
  placeSpanBars();
  const series = [{ label: "pod", points: hist.pod || [] },
    ...Object.entries(hist.containers || {}).map(([c, points]) => ({ label: c, points }))];
  drawGraphs("pod-graphs", series);
  const logs = document.getElementById("logs");
  logs.textContent = oldLog;
  logs.scrollTop = logsAt ?? logs.scrollHeight;
  try {
    const text = await get(`../containerLogs/${encodeURIComponent(ns)}/${encodeURIComponent(name)}/${encodeURIComponent(logContainer)}?tailLines=200`, true);
    if (gen !== generation) return false;
    // Where the user scrolled back to while the tail loaded wins over where it was.
    const at = logs.scrollTop + logs.clientHeight < logs.scrollHeight - 4 ? logs.scrollTop : logsAt;
    logs.textContent = text || "(no output yet)";
    logs.scrollTop = at ?? logs.scrollHeight;
  } catch (e) {
    logs.textContent = String(e.message);
  }
  return true;
}

// ---- routing ---------------------------------------------------------------------

// One refresh at a time: the next starts REFRESH_MS after the last ended. A refresh of a
// page the user has left (`generation` moved on) changes nothing.
async function refresh(gen) {
  const hash = location.hash || "#/";
  // (For a test that waits: a refresh under way since when.)
  document.body.dataset.refreshing = String(Date.now());
  try {
    const m = hash.match(/^#\/pod\/([^/]+)\/([^/]+)$/);
    let rendered;
    if (m) rendered = await podPage(gen, decodeURIComponent(m[1]), decodeURIComponent(m[2]));
    else if (hash === "#/pods") rendered = await podsPage(gen);
    else rendered = await nodePage(gen);
    if (!rendered || gen !== generation) return;
    setLive(true);
    document.body.dataset.loaded = hash;
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
    // For tests/bench/node-page.sh: when the data was first on screen.
    if (!performance.getEntriesByName("rendered " + hash).length) performance.mark("rendered " + hash);
  } catch (e) {
    if (gen !== generation) return;
    setLive(false, e.message);
    if (!view().querySelector("h1")) view().innerHTML = `<p class="bad">${esc(e.message)}</p>`;
  } finally {
    delete document.body.dataset.refreshing;
  }
}

async function loop(gen) {
  // The first refresh always (a page opened in a background tab, or a headless browser's,
  // may count as hidden), the next ones while the page is visible.
  let first = true;
  while (gen === generation) {
    if (first || !document.hidden) await refresh(gen);
    first = false;
    await new Promise((resolve) => { timer = setTimeout(resolve, REFRESH_MS); });
  }
}

function route() {
  generation++;
  delete document.body.dataset.loaded;
  delete view().dataset.pod;
  view().innerHTML = '<p class="muted">Loading…</p>';
  clearTimeout(timer);
  loop(generation);
}

window.addEventListener("hashchange", route);
route();
