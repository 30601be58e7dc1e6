// The dashboard page: polls /api/v1/state and renders it. Everything that came from the DHT
// is untrusted text, so it only ever goes into the page through textContent, never as HTML.
"use strict";

const POLL_MS = 1500;
const TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400];
const view = { sortKey: "stage", sortDir: 1, charts: {}, last: null };

const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function num(x, digits = 0) {
  if (x === null || x === undefined || !Number.isFinite(x)) return "–";
  return x.toLocaleString(undefined, { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

function bytes(x) {
  if (x === null || x === undefined || !Number.isFinite(x)) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(x) >= 1000 && i < units.length - 1) { x /= 1000; i++; }
  return `${x.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

function duration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "–";
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function shortPeer(id) {
  return id && id.length > 12 ? "…" + id.slice(-10) : id;
}

// ------------------------------------------------------------------ header and cards
function renderHeader(s) {
  const run = s.run;
  $("run-name").textContent = run ? `${run.name} · run ${run.hash}` : "no run yet";
  $("spec").textContent = run
    ? `codec ${run.codec} (width ${run.rank}) · ${run.stages} stages of ${run.stage_layers.join("/")} layers · ` +
      `d_model ${run.d_model}, ${run.n_layers} layers, vocab ${run.vocab}, seq ${run.seq_len}, ` +
      `batch ${run.batch_size} · wire ${run.wire_dtype}${run.quant !== "none" ? " + " + run.quant : ""} · ` +
      `basis re-fit every ${run.basis_interval} steps · replica sync ${run.replica_sync}` +
      `${run.replica_sync === "powersgd" ? " (rank " + run.replica_sync_rank + ")" : ""} · coordinator key ${run.key}`
    : "";
  const c = s.coordinator;
  $("coordinator").textContent = !c ? "" : c.seat_held
    ? `coordinator …${c.peer.slice(-8)} active since ${new Date(c.since * 1000).toLocaleTimeString()} (term ${c.term})`
    : `no coordinator holds the seat${c.peer ? " (last: …" + c.peer.slice(-8) + ")" : ""}: training goes on; ` +
      "no re-fit, revocation or new vouched hash until one is back";
  const err = $("error");
  err.hidden = !s.error;
  err.textContent = s.error || "";
  const age = s.updated ? Math.max(0, Date.now() / 1000 - s.updated) : null;
  $("updated").textContent = age === null ? "no data yet" : `updated ${age.toFixed(0)} s ago`;
  $("live-dot").className = "dot " + (age !== null && age < 10 && !s.error ? "ok" : "stale");
}

function renderCards(s) {
  const online = s.peers.filter((p) => p.online);
  const step = Math.max(0, ...online.map((p) => p.step || 0));
  const loss = s.series.loss.value;
  const speed = s.series.tokens_per_s.value;
  $("card-step").textContent = num(step);
  $("card-loss").textContent = loss.length ? num(loss[loss.length - 1], 3) : "–";
  $("card-speed").textContent = speed.length ? num(speed[speed.length - 1]) : "–";
  $("card-peers").textContent = `${online.length}`;
  const w = s.wire || {};
  $("card-wire").textContent = w.forward_bytes_per_token != null ? num(w.forward_bytes_per_token, 1) : "–";
  $("card-wire-sub").textContent = w.backward_bytes_per_token != null
    ? `backward ${num(w.backward_bytes_per_token, 1)}` : "";
  $("card-ratio").textContent = w.compression_ratio != null ? `${num(w.compression_ratio, 1)}×` : "–";
  $("card-dense").textContent = w.dense_bytes_per_token ? `dense ${num(w.dense_bytes_per_token, 1)} B/token` : "";
  $("card-sync").textContent = w.sync_bytes_per_step != null ? bytes(w.sync_bytes_per_step) : "–";
  $("card-sync-sub").textContent = w.replica_sync ? `${w.replica_sync}, per step of the busiest replica` : "";
  const b = s.basis || {};
  $("card-basis").textContent = b.version != null ? `v${b.version}` : "–";
  $("card-basis-sub").textContent = b.version != null
    ? (b.updated_step ? `since step ${b.updated_step}` : "initial basis") + (b.mixed ? " · peers disagree" : "")
    : "";
  $("card-invalid").textContent = `${s.invalid_records}`;
  $("card-problem").textContent = s.problems.length ? s.problems[s.problems.length - 1] : "";
}

// ------------------------------------------------------------------ stages
function renderStages(s) {
  const box = $("stages");
  box.replaceChildren(...s.stages.map((st) => {
    const node = el("div", null, "stage" + (st.covered ? "" : " missing") + (st.bottleneck ? " bottleneck" : ""));
    node.dataset.stage = st.stage;
    node.dataset.peers = st.peers;
    node.append(el("span", `stage ${st.stage}`, "name"), el("span", `${st.layers} layers`, "layers"),
      el("span", st.covered ? `${st.peers} peer${st.peers === 1 ? "" : "s"}` : "no peer", "peers"),
      el("span", `${num(st.tokens_per_s)} tok/s`, "speed"));
    if (st.bottleneck) node.append(el("span", st.covered ? "bottleneck" : "uncovered", "badge"));
    if (st.why) { node.title = st.why; node.append(el("div", st.why, "why")); }
    return node;
  }));
}

// ------------------------------------------------------------------ charts (uPlot)
function chart(id, label, color, series) {
  const host = $(id);
  const data = [series.time, series.value];
  host.dataset.points = String(series.value.length);
  const width = Math.max(280, host.clientWidth);
  let plot = view.charts[id];
  if (!plot) {
    plot = new uPlot({
      width, height: 220, legend: { show: false }, cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true } },
      // whole seconds at the finest: two samples 5 s apart would otherwise get millisecond ticks
      axes: [{ stroke: "#8a93a6", grid: { stroke: "#2a3142" }, incrs: TIME_INCRS },
             { stroke: "#8a93a6", grid: { stroke: "#2a3142" }, size: 60 }],
      series: [{}, { label, stroke: color, width: 2, points: { show: series.value.length < 60 } }],
    }, data, host);
    view.charts[id] = plot;
  } else {
    plot.setData(data);
    if (Math.abs(plot.width - width) > 4) plot.setSize({ width, height: 220 });
  }
}

// ------------------------------------------------------------------ peer tables
const COLUMNS = [
  ["peer_id", (p) => shortPeer(p.peer_id)], ["stage", (p) => p.stage], ["state", (p) => p.state],
  ["step", (p) => num(p.step)], ["tokens_per_s", (p) => p.standby ? `head, not leading: measured ~${num(p.measured_tokens_per_s)}` : num(p.tokens_per_s)], ["loss", (p) => num(p.loss, 3)],
  ["queue", (p) => num(p.queue)], ["bytes_out_per_s", (p) => bytes(p.bytes_out_per_s)],
  ["bytes_in_per_s", (p) => bytes(p.bytes_in_per_s)],
  ["forward_bytes_per_token", (p) => num(p.forward_bytes_per_token, 1)],
  ["sync_bytes_per_step", (p) => bytes(p.sync_bytes_per_step)],
  ["basis_version", (p) => (p.basis_version != null ? `v${p.basis_version}` : "–")], ["device", (p) => p.device || "–"],
  ["memory_bytes", (p) => bytes(p.memory_bytes)], ["peak_memory_bytes", (p) => bytes(p.peak_memory_bytes)],
  ["uptime_s", (p) => duration(p.uptime_s)],
  ["reachability", (p) => p.reachability || "–"], ["version", (p) => p.version || "–"],
  ["refused", (p) => num(p.refused)], ["age_s", (p) => duration(p.age_s)],
];
const NUMERIC = new Set(["stage", "step", "tokens_per_s", "loss", "queue", "bytes_out_per_s", "bytes_in_per_s",
  "forward_bytes_per_token", "sync_bytes_per_step", "basis_version", "memory_bytes",
  "peak_memory_bytes", "uptime_s", "refused", "age_s"]);

function compare(a, b) {
  const k = view.sortKey;
  const x = a[k], y = b[k];
  if (x == null && y == null) return a.peer_id < b.peer_id ? -1 : 1;
  if (x == null) return 1;
  if (y == null) return -1;
  const c = NUMERIC.has(k) ? x - y : String(x).localeCompare(String(y));
  return c !== 0 ? c * view.sortDir : (a.peer_id < b.peer_id ? -1 : 1);
}

function renderPeers(s) {
  const rows = [...s.peers].sort(compare).map((p) => {
    const tr = el("tr", null, `state-${p.state}`);
    tr.dataset.peer = p.peer_id;
    tr.dataset.state = p.state;
    tr.title = p.peer_id + (p.key ? ` · health key ${p.key}` : " · no health record");
    for (const [key, fmt] of COLUMNS) tr.append(el("td", fmt(p), NUMERIC.has(key) ? "num" : key));
    return tr;
  });
  $("peers").tBodies[0].replaceChildren(...rows);
  for (const th of $("peers").tHead.rows[0].cells) {
    th.setAttribute("aria-sort", th.dataset.key === view.sortKey ? (view.sortDir > 0 ? "ascending" : "descending") : "none");
  }
}

function renderBanned(s) {
  const rows = s.banned.map((b) => {
    const tr = el("tr");
    tr.dataset.peer = b.peer_id;
    const why = b.for_run ? `banned for the run: ${b.reason || "convicted by the leading head"} (swarm unban lifts it)`
      : "failed requests; avoided by routers";
    if (b.for_run) tr.className = "run-ban";
    tr.append(el("td", shortPeer(b.peer_id)), el("td", why),
      el("td", b.failures ? num(b.failures) : "–", "num"), el("td", b.reported_by.map(shortPeer).join(", ")));
    return tr;
  });
  for (const p of s.peers.filter((p) => p.state === "offline")) {
    const tr = el("tr", null, "state-offline");
    tr.dataset.peer = p.peer_id;
    tr.append(el("td", shortPeer(p.peer_id)), el("td", `offline (stage ${p.stage}, last seen ${duration(p.age_s)} ago)`),
      el("td", "–", "num"), el("td", ""));
    rows.push(tr);
  }
  if (!rows.length) {
    const td = el("td", "none");
    td.colSpan = 4;
    rows.push(el("tr", null, "empty"));
    rows[0].append(td);
  }
  $("banned").tBodies[0].replaceChildren(...rows);
}

// ------------------------------------------------------------------ the loop
function render(s) {
  view.last = s;
  renderHeader(s);
  renderCards(s);
  renderStages(s);
  chart("loss-chart", "loss", "#f5a524", s.series.loss);
  chart("speed-chart", "tokens/s", "#4cc38a", s.series.tokens_per_s);
  renderPeers(s);
  renderBanned(s);
  document.body.dataset.ready = "1";
}

async function poll() {
  try {
    const response = await fetch("/api/v1/state", { cache: "no-store" });
    if (!response.ok) throw new Error(`the dashboard answered ${response.status}`);
    render(await response.json());
  } catch (e) {
    const err = $("error");
    err.hidden = false;
    err.textContent = `cannot reach the dashboard server (${e.message}); retrying.`;
    $("live-dot").className = "dot stale";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

for (const th of document.querySelectorAll("#peers th[data-key]")) {
  th.addEventListener("click", () => {
    const key = th.dataset.key;
    view.sortDir = view.sortKey === key ? -view.sortDir : 1;
    view.sortKey = key;
    if (view.last) renderPeers(view.last);
  });
}
window.addEventListener("resize", () => { if (view.last) render(view.last); });
poll();
