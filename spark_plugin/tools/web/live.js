// arrowbeat live page: polls /api/executors and /api/events (same origin, the page cookie) and
// redraws. Text from the wire (ids, hosts, details) is only ever set as textContent.
"use strict";

const EVENT_TONE = {
  REGISTERED: "ok", REREGISTERED: "amber", TASK_RESUMED: "ok",
  HEARTBEAT_TIMEOUT: "red", UNREACHABLE: "red", UNMONITORED: "red", SPARK_LOST: "red", TASK_STUCK: "amber",
  SHUFFLE_CORRUPT: "red", DEGRADED: "amber", RECOVERED: "ok",
  UNREGISTERED: "gone", SPARK_REMOVED: "gone",
};
const MAX_EVENTS = 300;
const charts = new Map(); // executor id -> {plot, cell}
let lastSeq = 0;
let pollMs = 1000;

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function num(value, digits, unit) {
  if (value === null || value === undefined) return "-";
  return Number(value).toFixed(digits) + (unit || "");
}

function mib(bytes) {
  return bytes === null || bytes === undefined ? "-" : (bytes / 1048576).toFixed(0) + " MiB";
}

function seconds(s) {
  if (s === null || s === undefined) return "-";
  return s < 10 ? s.toFixed(1) + " s" : s.toFixed(0) + " s";
}

function clock(ts) {
  return new Date(ts * 1000).toLocaleTimeString([], { hour12: false });
}

function setStatus(kind, text) {
  const node = document.getElementById("status");
  node.dataset.status = kind;
  node.textContent = text;
}

function chartFor(id, cell, data, windowS, now) {
  // The last windowS seconds, or less while the history is shorter (at least 30 s): a young
  // executor's line spans the chart instead of a few pixels at its right edge.
  const first = data[0].length ? data[0][0] : now - 30;
  const span = [Math.max(now - windowS, Math.min(first, now - 30)), now];
  let entry = charts.get(id);
  if (entry && entry.cell === cell) {
    entry.span = span;
    entry.plot.setData(data);
    return;
  }
  if (entry) entry.plot.destroy();
  entry = { cell: cell, span: span };
  const opts = {
    width: 240, height: 48, padding: [6, 4, 4, 0], pxAlign: false, cursor: { show: false },
    legend: { show: false }, select: { show: false },
    scales: {
      x: { time: true, range: () => entry.span },
      y: { range: (u, min, max) => [0, Math.max(1, (max || 0) * 1.2)] },
    },
    axes: [{ show: false, size: 0 },
           { show: true, size: 34, ticks: { show: false }, font: "10px sans-serif", gap: 2,
             splits: (u) => [0, u.scales.y.max], values: (u, v) => v.map((x) => x.toFixed(1)) }],
    series: [{}, { stroke: "#1a73e8", width: 1.5, fill: "rgba(26,115,232,0.08)", points: { show: false } }],
  };
  entry.plot = new uPlot(opts, data, cell);
  charts.set(id, entry);
}

function renderExecutors(body) {
  document.getElementById("app-id").textContent = body.app_id || "-";
  document.getElementById("rm-address").textContent = body.rm_address || "-";
  document.getElementById("interval").textContent = body.interval_s + " s";
  document.getElementById("timeout").textContent = body.timeout_s + " s";
  document.getElementById("window").textContent = Math.round(body.rtt_window_s / 60) + " min";
  pollMs = Math.min(2000, Math.max(500, body.interval_s * 1000));

  const tbody = document.getElementById("executor-rows");
  const seen = new Set();
  const counts = {};
  for (const e of body.executors) {
    seen.add(e.executor_id);
    counts[e.state] = (counts[e.state] || 0) + 1;
    let row = tbody.querySelector(`tr[data-executor="${CSS.escape(e.executor_id)}"]`);
    if (!row) {
      row = el("tr");
      row.dataset.executor = e.executor_id;
      for (let i = 0; i < 12; i++) row.appendChild(el("td"));
      row.cells[5].appendChild(el("div", "chart"));
      tbody.appendChild(row);
    }
    row.dataset.state = e.state;
    row.dataset.health = e.health;
    const c = row.cells;
    c[0].textContent = e.executor_id;
    c[1].textContent = e.host || "-";
    const badge = el("span", "badge " + e.health, e.degraded ? e.state + " \u00b7 DEGRADED" : e.state);
    if (e.degraded) badge.title = e.degraded; // the evidence, as text
    c[2].replaceChildren(badge);
    c[3].replaceChildren(el("span", "age " + e.health, seconds(e.age_s)));
    c[3].className = "num";
    c[4].textContent = num(e.rtt_ms, 1, " ms");
    c[4].className = "num";
    const xs = e.rtt_history.map((p) => p[0]);
    const ys = e.rtt_history.map((p) => p[1]);
    chartFor(e.executor_id, c[5].firstChild, [xs, ys], body.rtt_window_s, body.now);
    c[6].textContent = e.slots_total === null ? "-" : `${e.slots_busy ?? "-"}/${e.slots_total}`;
    c[7].textContent = e.running_tasks ?? "-";
    c[7].className = "num";
    c[8].textContent = mib(e.rss_bytes);
    c[8].className = "num";
    if (e.shuffle_pool_used_pct === null) {
      c[9].textContent = "-";
    } else {
      const bar = el("span", "bar");
      const fill = el("i");
      fill.style.width = Math.min(100, Math.max(0, e.shuffle_pool_used_pct)) + "%";
      bar.appendChild(fill);
      c[9].replaceChildren(bar, document.createTextNode(num(e.shuffle_pool_used_pct, 0, "%")));
    }
    c[10].textContent = e.jvm_pulse_age_ms === null ? "-" : e.jvm_pulse_age_ms + " ms";
    c[10].className = "num";
    c[11].textContent = e.pid ?? "-";
  }
  for (const row of Array.from(tbody.rows)) {
    if (!seen.has(row.dataset.executor)) {
      const entry = charts.get(row.dataset.executor);
      if (entry) entry.plot.destroy();
      charts.delete(row.dataset.executor);
      row.remove();
    }
  }
  document.getElementById("counts").textContent = Object.entries(counts)
    .map(([state, n]) => `${n} ${state}`).join(", ");
}

function renderEvents(body) {
  const list = document.getElementById("events");
  for (const ev of body.events) {
    if (ev.seq <= lastSeq) continue;
    lastSeq = ev.seq;
    const item = el("li");
    item.dataset.kind = ev.kind;
    item.dataset.executor = ev.executor_id;
    item.dataset.tone = EVENT_TONE[ev.kind] || "gone";
    item.append(el("time", null, clock(ev.ts)), el("span", "kind", ev.kind),
                document.createTextNode(`executor ${ev.executor_id}` + (ev.host ? ` on ${ev.host}` : "")));
    if (ev.detail) item.appendChild(el("span", "detail", ev.detail));
    list.insertBefore(item, list.firstChild);
  }
  while (list.children.length > MAX_EVENTS) list.removeChild(list.lastChild);
}

async function getJson(path) {
  const response = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (response.status === 401) throw new Error("not authorised: open the URL with ?token=... from the driver's log");
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

async function poll() {
  try {
    const [executors, events] = await Promise.all([getJson("/api/executors"), getJson(`/api/events?after=${lastSeq}`)]);
    renderExecutors(executors);
    renderEvents(events);
    setStatus("ok", "updated " + clock(executors.now));
  } catch (err) {
    setStatus("error", String(err.message || err));
  }
  setTimeout(poll, pollMs);
}

poll();
