"""The status page every node and proxy serves next to its metrics
(`http://<host>:<http_port>/`): read-only, one HTML document with its
script inline (no external resource: it works on an air-gapped machine),
refreshed every two seconds from `/status.json`. A node shows the cluster
as it sees it, its partitions and their queues with depth and rates (worked
out from successive answers); a proxy shows its upstream and buffer."""

from __future__ import annotations

import json
from typing import Any, Callable

from protocol.metrics import Route

REFRESH_MS = 2000

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Taproot status</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2a24; background: #f6f8f7; }
  header { background: #1f4e3d; color: #fff; padding: 14px 24px; }
  header h1 { margin: 0; font-size: 20px; }
  header .sub { opacity: .85; }
  main { padding: 16px 24px; }
  table { border-collapse: collapse; margin: 8px 0 24px; background: #fff; }
  th, td { padding: 4px 10px; border-bottom: 1px solid #dfe6e2; text-align: left; }
  td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
  th { background: #e4ece8; }
  .deep { background: #ffe8b3; }
  .bad { color: #a11; font-weight: 600; }
  #updated { color: #56655d; }
  .bar { display: inline-block; height: 10px; background: #2d8a5f; vertical-align: middle; }
</style>
</head>
<body>
<header><h1 id="title">Taproot</h1><div class="sub" id="subtitle">loading...</div></header>
<main>
<p id="updated"></p>
<div id="role"></div>
<h2 id="partitions-title" hidden>Partitions</h2>
<table id="partitions" hidden><thead><tr><th>partition</th><th>leader</th><th class="n">epoch</th>
<th>here</th><th class="n">queues</th><th class="n">authority lag</th></tr></thead><tbody></tbody></table>
<h2 id="queues-title" hidden>Queues</h2>
<table id="queues" hidden><thead><tr><th>queue</th><th class="n">partition</th><th>mode</th>
<th class="n">consumers</th><th class="n">producers</th><th>app</th><th class="n">depth</th><th></th>
<th class="n">unconfirmed</th><th class="n">puts/s</th><th class="n">pushes/s</th><th class="n">confirms/s</th>
</tr></thead><tbody></tbody></table>
</main>
<script>
"use strict";
let previous = null;
const text = (v) => document.createTextNode(String(v));
function cell(row, value, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  td.appendChild(typeof value === "object" && value !== null ? value : text(value));
  row.appendChild(td);
  return td;
}
function rate(now, before, seconds) {
  if (before === undefined || seconds <= 0) return "-";
  return (Math.max(0, now - before) / seconds).toFixed(1);
}
function render(data) {
  const s = data.status;
  document.getElementById("title").textContent = ["Taproot", s.role, s.name].filter(Boolean).join(" ");
  document.getElementById("subtitle").textContent = s.role === "node"
    ? `cluster ${s.cluster} - ${s.address} - up ${Math.round(s.uptime_s)} s - domains version ${s.domains_version}`
    : `upstream ${s.connected ? s.upstream : "NOT connected"} - ${s.sessions} session(s)` +
      ` - up ${Math.round(s.uptime_s)} s`;
  const buffer = s.retransmission_buffer;
  document.getElementById("role").textContent =
    `retransmission buffer: ${buffer.messages} PUT(s), ${buffer.bytes} bytes` +
    (s.role === "proxy" ? ` - failovers: ${s.failovers}` : "");
  const parts = document.querySelector("#partitions tbody");
  parts.replaceChildren();
  for (const p of s.partitions || []) {
    const row = document.createElement("tr");
    cell(row, p.partition); cell(row, p.leader || "(none)"); cell(row, p.epoch, "n");
    cell(row, p.here ? "yes" : "no"); cell(row, p.queues ?? "-", "n");
    cell(row, p.authority_lag_s === undefined ? "-" : p.authority_lag_s.toFixed(1) + " s",
         "n" + (p.authority_lag_s > 60 ? " bad" : ""));
    parts.appendChild(row);
  }
  for (const id of ["partitions", "partitions-title"]) document.getElementById(id).hidden = !s.partitions;
  const queues = data.queues || [];
  const seconds = previous ? data.time - previous.time : 0;
  const before = {};
  for (const q of previous ? previous.queues || [] : []) {
    before[q.uri + "|*"] = q.puts;
    for (const a of q.apps) { before[q.uri + "|" + a.app] = [a.pushed, a.confirmed]; }
  }
  const deepest = Math.max(1, ...queues.flatMap((q) => q.apps.map((a) => a.depth)));
  const body = document.querySelector("#queues tbody");
  body.replaceChildren();
  for (const q of queues) {
    const apps = q.apps.length ? q.apps : [null];
    apps.forEach((a, i) => {
      const row = document.createElement("tr");
      row.dataset.uri = q.uri;
      row.dataset.app = a ? a.app : "";
      cell(row, i === 0 ? q.uri : ""); cell(row, i === 0 ? q.partition : "", "n");
      cell(row, i === 0 ? q.mode : ""); cell(row, i === 0 ? q.consumers : "", "n");
      cell(row, i === 0 ? q.producers : "", "n"); cell(row, a ? (a.app || "-") : "-");
      const depth = a ? a.depth : 0;
      cell(row, depth, "n depth" + (depth > 0 && q.consumers === 0 ? " deep" : ""));
      const bar = document.createElement("span");
      bar.className = "bar";
      bar.style.width = Math.round(120 * depth / deepest) + "px";
      cell(row, bar);
      cell(row, a ? a.unconfirmed : 0, "n");
      cell(row, i === 0 ? rate(q.puts, before[q.uri + "|*"], seconds) : "", "n");
      const was = a ? before[q.uri + "|" + a.app] : undefined;
      cell(row, a ? rate(a.pushed, was && was[0], seconds) : "-", "n");
      cell(row, a ? rate(a.confirmed, was && was[1], seconds) : "-", "n");
      body.appendChild(row);
    });
  }
  for (const id of ["queues", "queues-title"]) document.getElementById(id).hidden = s.role !== "node";
  document.getElementById("updated").textContent =
    `updated ${new Date(data.time * 1000).toLocaleTimeString()} - ${queues.length} queue(s)`;
  previous = data;
}
async function refresh() {
  try {
    const response = await fetch("status.json", {cache: "no-store"});
    if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
    render(await response.json());
  } catch (error) {
    document.getElementById("updated").textContent = `not updated: ${error}`;
    document.getElementById("updated").className = "bad";
  }
}
refresh();
setInterval(refresh, REFRESH_MS);
</script>
</body>
</html>
""".replace("REFRESH_MS", str(REFRESH_MS))


def routes(data: Callable[[], dict[str, Any]]) -> dict[str, Route]:
    """`/` (the page) and `/status.json` (what it shows, from `data`)."""
    return {"/": lambda: ("text/html; charset=utf-8", PAGE.encode()),
            "/status.json": lambda: ("application/json", json.dumps(data(), default=str).encode())}
