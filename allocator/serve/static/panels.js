// The page's panels around the heatmap: totals, legend, host drill-down, queue, jobs across
// hosts, idle holders, unassigned use, free GPUs, what is broken, top users and teams, history. Each renders one JSON answer.
"use strict";

const SUMMARY_SKIP = new Set(["pool", "name"]);

// /api/v1/summary: a row per pool and the total (pools as a list of rows or a map by name).
function renderSummary(doc) {
  const pools = Array.isArray(doc.pools) ? doc.pools
    : Object.entries(doc.pools || {}).map(([pool, row]) => ({pool, ...row}));
  const rows = [...pools.map((p) => [p.pool || p.name || "no pool", p]), ["total", doc.total || {}]];
  const columns = [];
  for (const [, row] of rows) for (const [k, v] of Object.entries(row)) {
    if (!SUMMARY_SKIP.has(k) && typeof v === "number" && !columns.includes(k)) columns.push(k);
  }
  const head = el("tr", {}, el("th", {}, "pool"), ...columns.map((c) => el("th", {class: "num"}, c.replace(/_/g, " "))));
  const body = rows.map(([name, row]) => el("tr", {"data-pool": name},
    el(name === "total" ? "th" : "td", {}, name),
    ...columns.map((c) => el("td", {class: "num", "data-column": c},
      typeof row[c] === "number" ? row[c].toLocaleString("en-US") : ""))));
  return el("table", {id: "summary-table"}, head, ...body);
}

function renderLegend(states, counts, matched, filtered) {
  return states.map((s, i) => el("span", {"data-state": s},
    el("span", {class: "swatch", "data-colour": STATE_COLOURS[s] || STATE_COLOURS.unknown}),
    (STATE_WORDS[s] || s) + ": " + (filtered ? matched[i].toLocaleString("en-US") + " of " : "") +
      counts[i].toLocaleString("en-US")));
}

// Swatch colours are set through the CSSOM (the page's policy allows no style attributes).
function paintSwatches(root) {
  for (const swatch of root.querySelectorAll(".swatch[data-colour]")) swatch.style.background = swatch.dataset.colour;
}

function gpuCell(host, row, jobs, served) {
  const classes = ["gpu"];
  if (some(row.holder)) classes.push("held");
  if (row.idle_holder) classes.push("idle");
  if (row.health !== "ok" && row.health !== "-") classes.push("unhealthy");
  const cell = el("td", {class: classes.join(" "), "data-host": host, "data-gpu": row.gpu},
    el("div", {class: "id"}, "GPU " + row.gpu),
    el("div", {class: "holder"}, some(row.holder) ? row.holder : "free"));
  if (some(row.since)) cell.append(el("div", {class: "meta"}, "since " + row.since));
  if (some(row.slots)) cell.append(el("div", {class: "meta"}, row.slots));
  if (some(row.reason)) cell.append(el("div", {class: "meta"}, row.reason));
  if (row.health !== "ok") cell.append(el("div", {class: "note health"}, row.health));
  if (some(row.idle)) {
    const job = jobs.find((j) => j.job === row.holder && typeof j.idle_seconds === "number");
    const shown = job ? duration(job.idle_seconds + since(served)) : row.idle;
    cell.append(el("div", {class: "note idle"}, "idle " + shown + (row.idle_holder ? ": past its idle rule" : "")));
  }
  if (some(row.reserved)) cell.append(el("div", {class: "note"}, "reserved: " + row.reserved));
  for (const p of row.unassigned || []) {
    const who = (p.user || "?") + " pid " + p.pid + (p.job ? " (job " + p.job + ")" : "");
    cell.append(el("div", {class: "stray", title: p.command || ""}, "unassigned: " + who));
  }
  return cell;
}

// Why the agent gave up on a job: its failed worker's last lines (text only, never HTML).
function gaveUp(j) {
  if (!j.output_tail || !j.output_tail.length) return "";
  return el("details", {class: "gave-up"}, el("summary", {}, "last output (log " + (j.log_path || "?") + ")"),
    el("pre", {}, j.output_tail.join("\n")));
}

function jobRows(h, served) {
  return h.jobs.map((j) => {
    const idle = j.idle_seconds === null || j.idle_seconds === undefined ? "" :
      duration(j.idle_seconds + since(served)) + (j.idle_holder ? ", past its rule: " + j.idle_rule : "");
    return el("tr", {"data-job": j.job}, el("td", {}, j.job), el("td", {}, h.host),
      el("td", {}, j.gpus), el("td", {}, j.since || ""), el("td", {}, j.by || ""),
      el("td", {}, j.workers || "", gaveUp(j)), el("td", {}, idle), el("td", {}, j.reason || ""));
  });
}

// /api/v1/hosts/{host}: the host's GPUs, each with its holder, and its jobs.
function renderHost(h, served) {
  const agent = el("span", {class: "agent-" + h.agent}, "agent " + h.agent);
  const vendor = el("span", {class: h.vendor_mismatch ? "agent-gone" : "", title: h.vendor_mismatch || ""},
    (h.vendor || "") + (h.vendor_mismatch ? " (policy differs)" : ""));
  const gpus = el("table", {}, el("tr", {"data-host": h.host, class: h.agent === "gone" ? "dead" : ""},
    ...h.gpus.map((g) => gpuCell(h.host, g, h.jobs, served))));
  const jobs = h.jobs.length ? table(["job", "host", "GPUs", "since", "by", "workers", "idle", "reason"], jobRows(h, served))
    : muted("No job holds anything here.");
  const bad = (h.bad_records || []).length ? muted("Unreadable records: " + h.bad_records.join(", ")) : null;
  return [el("p", {}, agent, " · ", vendor), gpus, el("h3", {}, "Jobs"), jobs, bad];
}

function renderQueue(doc) {
  const rows = doc.queue.map((q) => el("tr", {},
    el("td", {}, String(q.position)), el("td", {}, q.host), el("td", {}, q.holder),
    el("td", {}, q.job), el("td", {}, q.requested), el("td", {}, q.since), el("td", {}, q.why)));
  return rows.length ? table(["#", "host", "who", "job", "what", "since", "why"], rows)
    : muted("No requests are waiting.");
}

function renderGroups(groups, pick) {
  if (!groups.length) return muted("No job runs across several hosts.");
  return table(["job", "hosts", "port", "shares"], groups.map((g) => el("tr", {"data-group": g.job},
    el("td", {}, g.job), el("td", {}, hostLinks(g.nodes, pick)), el("td", {}, g.master_port ?? ""),
    el("td", {}, g.shares.map((s) => s.host + " rank " + s.rank + ": " + (s.gpus || "no share") +
      (s.agent === "alive" ? "" : " (" + agentWords(s.agent) + ")")).join("; ")))));
}

function hostLinks(names, pick) {
  const shown = names.slice(0, 8).map((n) => {
    const button = el("button", {type: "button", class: "link", "data-pick": n}, n);
    button.addEventListener("click", () => pick(n));
    return button;
  });
  const parts = [];
  shown.forEach((b, i) => { if (i) parts.push(", "); parts.push(b); });
  if (names.length > shown.length) parts.push(" and " + (names.length - shown.length) + " more");
  return el("span", {}, ...parts);
}

// Idle holders: GPUs held but idle, from /api/v1/status?state=idle (a page of hosts).
function renderIdle(doc, served, pick) {
  const rows = [];
  for (const h of doc.hosts) for (const g of h.gpus) {
    if (!some(g.idle)) continue;
    const job = h.jobs.find((j) => j.job === g.holder && typeof j.idle_seconds === "number");
    const idle = job ? duration(job.idle_seconds + since(served)) : g.idle;
    rows.push(el("tr", {"data-host": h.host, "data-gpu": g.gpu}, el("td", {}, hostLinks([h.host], pick)),
      el("td", {}, g.gpu), el("td", {}, g.holder || ""), el("td", {}, idle + (g.idle_holder ? ": past its idle rule" : ""))));
  }
  if (!rows.length) return muted("No held GPU is idle.");
  const more = doc.page && doc.page.pages > 1
    ? muted("First " + doc.hosts.length + " of " + doc.page.hosts.toLocaleString("en-US") + " hosts (the state filter shows them all).") : null;
  return el("div", {}, table(["host", "GPU", "holder", "idle"], rows), more);
}

// Unassigned use: the cells the heatmap shows as such (processes nobody was given the GPU for).
function renderUnassigned(fleet, pick) {
  const code = String(fleet.states.indexOf("unassigned"));
  const hosts = fleet.hosts.filter((h) => h[3].includes(code));
  if (!hosts.length) return muted("No process runs on a GPU it was not given.");
  const rows = hosts.slice(0, 10).map((h) => el("tr", {"data-host": h[0]}, el("td", {}, hostLinks([h[0]], pick)),
    el("td", {}, [...h[3]].flatMap((c, g) => (c === code ? [g] : [])).join(","))));
  const more = hosts.length > 10 ? muted("and " + (hosts.length - 10).toLocaleString("en-US") + " more hosts (the state filter shows them all)") : null;
  return el("div", {}, table(["host", "GPUs"], rows), more);
}

// Where free GPUs are: /api/v1/free, the hosts with the most, of the pool chosen.
function renderFree(doc, pick) {
  const head = el("p", {class: "muted", id: "free-total"}, doc.free.toLocaleString("en-US") + " of " +
    doc.gpus.toLocaleString("en-US") + " GPUs free, on " + doc.hosts_total.toLocaleString("en-US") + " hosts");
  if (!doc.hosts.length) return [head];
  const rows = doc.hosts.map((h) => el("tr", {"data-host": h.host, "data-free": h.free},
    el("td", {}, hostLinks([h.host], pick)), el("td", {}, h.pool || "no pool"),
    el("td", {class: "num"}, h.free + " / " + h.total)));
  const more = doc.hosts_total - doc.hosts.length;
  return [head, table(["host", "pool", "free / GPUs"], rows),
    more > 0 ? muted("and " + more.toLocaleString("en-US") + " more hosts with a free GPU") : null];
}

// What is broken: /api/v1/broken, unhealthy GPUs and agents down, longest broken first.
function renderBroken(doc, pick) {
  const when = (since) => since + (since === doc.since_serve_started ? " (or before: serve's start)" : "");
  const parts = [];
  if (doc.gpus.length) {
    parts.push(table(["host", "GPU", "reason", "since"], doc.gpus.map((g) =>
      el("tr", {"data-host": g.host, "data-gpu": g.gpu}, el("td", {}, hostLinks([g.host], pick)),
        el("td", {}, g.gpu), el("td", {}, g.reason), el("td", {}, when(g.since))))));
  }
  if (doc.gpus_total > doc.gpus.length) parts.push(muted("and " + (doc.gpus_total - doc.gpus.length).toLocaleString("en-US") + " more unhealthy GPUs (the state filter shows them all)"));
  if (doc.agents.length) {
    parts.push(table(["host", "agent", "since"], doc.agents.map((a) =>
      el("tr", {"data-agent": a.host}, el("td", {}, hostLinks([a.host], pick)),
        el("td", {class: "agent-" + a.state}, a.reason), el("td", {}, when(a.since))))));
  }
  if (doc.agents_total > doc.agents.length) parts.push(muted("and " + (doc.agents_total - doc.agents.length).toLocaleString("en-US") + " more agents down"));
  return parts.length ? parts : [muted("Every GPU is healthy and every agent up.")];
}

// A user's (or a team's members') jobs: the heatmap filtered to them (/#user=alice,bob).
function jobsLink(row, by) {
  const users = by === "user" ? [row.key] : row.members || [];
  if (!users.length) return row.key;
  return el("a", {href: "#user=" + users.map(encodeURIComponent).join(",")}, row.key);
}

// Top users or teams: one row each, GPU-hours over the window; each links to its jobs.
function renderTop(doc, by) {
  const rows = doc.rows.map((r) => el("tr", {"data-holder": r.key, "data-gpu-hours": r.gpu_hours},
    el("td", {}, jobsLink(r, by)),
    el("td", {class: "num"}, r.gpu_hours.toFixed(1)), el("td", {class: "num"}, String(r.job_count))));
  if (!rows.length) return muted("No GPUs were held in this window.");
  const more = doc.rows_total > rows.length ? muted("of " + doc.rows_total.toLocaleString("en-US") + " " + by + "s") : null;
  return [table([by, "GPU-hours", "jobs"], rows), more];
}

function renderHistory(doc) {
  const rows = doc.entries.map((e) => el("tr", {},
    el("td", {}, e.at), el("td", {}, e.by), el("td", {}, e.action), el("td", {}, e.host || ""),
    el("td", {}, e.job || ""), el("td", {}, place(e.from)), el("td", {}, place(e.to)),
    el("td", {}, e.reason || "")));
  return rows.length ? table(["when", "who", "what", "host", "job", "from", "to", "reason"], rows)
    : muted("No history.");
}
