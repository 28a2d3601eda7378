// Phalanx dashboard: polls state.json, draws the cluster; #/node/N, #/queue/Q, #/workload/W drill down.
"use strict";
const POLL_MS = 2000;
let state = null;

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function link(kind, name) { return `<a href="#/${kind}/${encodeURIComponent(name)}">${esc(name)}</a>`; }
function num(v, digits = 1) { return Number(v).toLocaleString(undefined, {maximumFractionDigits: digits}); }
function gpuColor(used) {
  if (used <= 0) return "var(--free)";
  if (used >= 0.999) return "var(--used)";
  return "var(--part)";
}
function when(t) { return t ? new Date(t * 1000).toLocaleTimeString() : "-"; }

async function fetchJson(path) {
  const r = await fetch(path, {cache: "no-store"});
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}

function overview(s) {
  const sum = s.summary;
  const pools = s.pools.map(p => `<tr><td>${esc(p.name)}</td><td class="num">${p.nodes}</td><td class="num">${p.gpus}</td>
    <td class="num">${num(p.used)}</td><td><div class="bar"><i style="width:${p.gpus ? 100 * p.used / p.gpus : 0}%"></i></div></td></tr>`).join("");
  const byPool = {};
  for (const n of s.nodes) (byPool[n.pool] = byPool[n.pool] || []).push(n);
  const maps = Object.entries(byPool).map(([pool, nodes]) => `<h3 style="font-size:14px;margin:10px 0 6px">${esc(pool)} <span class="note">(${nodes.length} nodes)</span></h3>
    <div class="nodes">${nodes.map(n => `<a class="node${n.ready ? "" : " down"}" href="#/node/${encodeURIComponent(n.name)}" title="${esc(n.name)}" data-node="${esc(n.name)}">${
      n.gpus.map(u => `<span class="gpu" style="background:${gpuColor(u)}"></span>`).join("")}</a>`).join("")}</div>`).join("");
  const queues = s.queues.length ? `<div class="scroll"><table><tr><th>queue</th><th>parent</th><th class="num">deserved GPUs</th>
    <th class="num">fair share GPUs</th><th class="num">used GPUs</th><th class="num">waiting GPUs</th><th>used / fair share</th></tr>${
    s.queues.map(q => `<tr><td>${link("queue", q.name)}</td><td>${esc(q.parent || "-")}</td><td class="num">${num(q.deserved)}</td>
      <td class="num">${num(q.fair)}</td><td class="num">${num(q.used)}</td><td class="num">${num(q.waiting)}</td>
      <td><div class="bar"><i style="width:${Math.min(100, q.fair ? 100 * q.used / q.fair : 0)}%"></i></div></td></tr>`).join("")}</table></div>`
    : `<p class="note">No queues: every workload is in the default queue.</p>`;
  const sharded = Array.isArray(s.shards);  // `phalanx dashboard --shards`: every shard on one board
  const pending = s.pending.length ? `<div class="scroll"><table id="pending"><tr><th>workload</th>${sharded ? "<th>shard</th>" : ""}<th>queue</th><th class="num">pods</th><th>why it waits</th><th>forecast</th></tr>${
    s.pending.map(p => `<tr data-workload="${esc(p.workload)}"><td>${link("workload", p.workload)}</td>${sharded ? `<td>${esc(p.shard)}</td>` : ""}<td>${esc(p.queue)}</td><td class="num">${p.pods}</td>
      <td class="why">${esc(p.why)}</td><td class="why">${esc(p.forecast || "-")}</td></tr>`).join("")}</table></div>`
    : `<p class="note">Nothing waits.</p>`;
  const shards = sharded ? `<section><h2>Scheduling shards</h2><div class="scroll"><table id="shards"><tr><th>shard</th><th>owns</th><th>profile</th>
    <th class="num">nodes</th><th class="num">GPUs</th><th class="num">in use</th><th class="num">running</th><th class="num">waiting</th><th class="num">problems</th></tr>${
    s.shards.map(r => `<tr data-shard="${esc(r.name)}"><td>${esc(r.name)}</td><td>${esc(r.owns)}</td><td>${esc(r.profile)}</td><td class="num">${r.nodes}</td>
      <td class="num">${r.gpus}</td><td class="num">${num(r.gpus_used)}</td><td class="num">${r.running}</td><td class="num">${r.waiting}</td>
      <td class="num">${r.problems}</td></tr>`).join("")}</table></div></section>` : "";
  const recent = s.recent.length ? `<div class="scroll"><table id="recent"><tr><th>time</th><th>what</th><th>pod</th><th>where</th><th>why</th></tr>${
    s.recent.slice(0, 50).map(r => `<tr><td>${when(r.t)}</td><td><span class="tag ${r.kind === "bound" || r.kind === "shadow agree" ? "ok" : "warn"}">${esc(r.kind)}</span></td>
      <td>${esc(r.what)}</td><td>${r.where ? link("node", r.where) : "-"}</td><td class="why">${esc(r.why)}</td></tr>`).join("")}</table></div>`
    : `<p class="note">No decisions yet.</p>`;
  const sh = s.shadow && s.shadow.scheduler ? s.shadow : null;  // `phalanx scheduler --shadow`
  const shadow = sh ? `<section id="shadow"><h2>Shadow of ${esc(sh.scheduler)}</h2><p>${sh.judged} placement(s) judged, ${sh.agreed} agreed
    (Phalanx binds nothing here).</p><div class="scroll"><table><tr><th>verdict</th><th>reason</th><th class="num">pods</th></tr>${
    sh.by_reason.map(r => `<tr><td><span class="tag ${r.verdict === "agree" ? "ok" : "warn"}">${esc(r.verdict)}</span></td><td>${esc(r.reason)}</td>
      <td class="num">${r.pods}</td></tr>`).join("")}</table></div>${Object.entries(sh.partial_gangs).map(([g, t]) =>
    `<p class="why">gang placed partially: ${esc(g)}: ${esc(t)}</p>`).join("")}</section>` : "";
  const problems = s.problems.length ? `<section><h2>Objects left out</h2><ul>${s.problems.map(p => `<li>${esc(p)}</li>`).join("")}</ul></section>` : "";
  return `<div class="cards">
      <div class="card"><div class="v" id="gpus-used">${num(sum.gpus_used)} / ${sum.gpus}</div><div class="k">GPUs in use</div></div>
      <div class="card"><div class="v">${sum.nodes}</div><div class="k">nodes</div></div>
      <div class="card"><div class="v">${sum.running}</div><div class="k">workloads running</div></div>
      <div class="card"><div class="v" id="waiting">${sum.waiting}</div><div class="k">workloads waiting</div></div></div>
    ${shards}<section><h2>GPU map</h2><p class="legend"><span><i style="background:var(--free)"></i>free</span><span><i style="background:var(--part)"></i>shared</span>
      <span><i style="background:var(--used)"></i>in use</span><span class="note">one cell per GPU; select a node for its pods</span></p>
      <div class="scroll"><table><tr><th>pool</th><th class="num">nodes</th><th class="num">GPUs</th><th class="num">in use</th><th></th></tr>${pools}</table></div>${maps}</section>
    <section><h2>Waiting workloads</h2>${pending}</section>
    <section><h2>Queues</h2>${queues}</section>
    ${shadow}<section><h2>Recent decisions</h2>${recent}</section>${problems}`;
}

function nodeView(d) {
  const gpus = d.gpus.map(g => {
    const hs = g.holders.map(h => h.pod ? `${link("workload", h.workload)} <span class="note">${esc(h.pod)}${h.share ? ` (${h.share} GPU)` : ""}${h.mig ? ` (MIG ${esc(h.mig)})` : ""}</span>` : esc(h.other)).join("<br>");
    return `<tr data-gpu="${g.index}"><td class="num">${g.index}</td><td>${esc(g.model)}${g.mig ? " (MIG)" : ""}</td><td class="num">${num(g.memory_mib / 1024)} GiB</td>
      <td><span class="gpu big" style="display:inline-block;background:${gpuColor(g.used)}"></span></td><td>${hs || "-"}${g.reservation ? ' <span class="tag warn">reservation pod</span>' : ""}</td></tr>`;
  }).join("");
  return `<section><h2>Node ${esc(d.name)}</h2><p class="note">pool ${esc(d.pool)}</p>
    <div class="scroll"><table id="node-gpus"><tr><th class="num">GPU</th><th>model</th><th class="num">memory</th><th>use</th><th>held by</th></tr>${gpus}</table></div>
    <h3 style="font-size:14px">Labels</h3><div class="scroll"><table>${Object.entries(d.labels).map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(v)}</td></tr>`).join("")}</table></div></section>`;
}

function queueView(d) {
  return `<section><h2>Queue ${esc(d.name)}</h2><div class="cards">
    <div class="card"><div class="v">${num(d.deserved)}</div><div class="k">deserved GPUs</div></div>
    <div class="card"><div class="v">${num(d.fair)}</div><div class="k">fair share GPUs</div></div>
    <div class="card"><div class="v">${num(d.used)}</div><div class="k">used GPUs</div></div>
    <div class="card"><div class="v">${num(d.waiting)}</div><div class="k">waiting GPUs</div></div></div>
    <h3 style="font-size:14px">Workloads</h3><ul>${d.workloads.map(w => `<li>${link("workload", w)}</li>`).join("") || "<li>none</li>"}</ul></section>`;
}

function workloadView(d) {
  return `<section><h2>Workload ${esc(d.name)}</h2><p><span class="tag ${d.state === "running" ? "ok" : "warn"}" id="wl-state">${esc(d.state)}</span>
    queue ${link("queue", d.queue)}, priority ${d.priority}</p>
    ${d.members ? `<p id="wl-gang"><b>Gang:</b> ${esc(d.phase)}: ${esc(d.members)}</p>` : ""}
    ${d.why ? `<p><b>Why it waits:</b> ${esc(d.why)}</p>` : ""}${d.forecast ? `<p id="wl-forecast"><b>Forecast:</b> ${esc(d.forecast)}</p>` : ""}
    <div class="scroll"><table><tr><th>pod</th><th>node</th><th>GPUs</th></tr>${d.pods.map(p => `<tr><td>${esc(p.pod)}</td>
      <td>${p.node ? link("node", p.node) : "-"}</td><td>${p.gpus.join(", ") || "-"}</td></tr>`).join("")}</table></div></section>`;
}

async function render() {
  const route = decodeURIComponent(location.hash.replace(/^#\/?/, ""));
  const [kind, ...rest] = route.split("/");
  const name = rest.join("/");
  try {
    state = await fetchJson("state.json");
    document.getElementById("meta").textContent = state.warming_up
      ? "waiting for the first cycle…"
      : `${state.mode} · updated ${when(state.generated)} · ${state.summary.nodes} nodes, ${state.summary.gpus} GPUs`;
    if (state.warming_up) { show(`<p class="note">The scheduler has not finished a cycle since the dashboard was opened; it will appear within seconds.</p>`); return; }
    if (["node", "queue", "workload"].includes(kind) && name) {
      const d = await fetchJson(`api/${kind}/${encodeURIComponent(name)}`);
      show({node: nodeView, queue: queueView, workload: workloadView}[kind](d) + `<p><a href="#/">← back to the cluster</a></p>`);
    } else {
      show(overview(state));
    }
  } catch (e) {
    show(`<section><h2>Not available</h2><p>${esc(e.message)}</p></section>`);
  }
}

// Redrawn only when it reads differently: a poll that changed nothing keeps the page as it is
// (a text selection, a scrolled table, the elements a reader's tools point at).
let shown = null;
function show(html) {
  if (html === shown) return;
  shown = html;
  document.getElementById("view").innerHTML = html;
}

window.addEventListener("hashchange", render);
render();
setInterval(render, POLL_MS);
