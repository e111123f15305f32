// The status page: draws serve's JSON API (answered from its in-memory mirror, never a store
// read). The fleet grid comes from the event stream (/api/v1/events?snapshot=grid: the grid,
// then each change's rows); while the stream fails it is polled every 2 s instead. The
// panels are read when the fleet changed.
"use strict";

const POLL_MS = 2000;            // the fleet grid, while the stream fails
const STREAM_RETRY_MS = 30000;   // while polling, the stream is tried again this often
const DETAILS_MS = 15000;        // summary, idle holders, jobs across hosts, even without a change
const REDRAW_MS = 5000;          // times move on between answers: idle times redrawn
const STATUS_PAGE = 1000;        // hosts per status page read for the job and user filters
const FILTER_REREAD_MS = 15000;  // a job or user filter's hosts are read again at most this often
const LIST_ROWS = 20;            // rows of the free-GPU and broken lists

const heatmap = new Heatmap($("heatmap"), $("tooltip"), $("cursor"), (name, gpu) => openHost(name, gpu));
const plots = new Plots($("plots"));
let fleet = null, openName = null, lastHost = null, lastIdle = null, filterCells = null;
let detailsTimer = null, filterRun = 0, filteredAt = 0, polling = false;

function sameFleet(a, b) {
  if (!a || a.revision !== b.revision || a.hosts.length !== b.hosts.length) return false;
  return a.hosts.every((h, i) => h[0] === b.hosts[i][0] && h[1] === b.hosts[i][1] &&
    h[2] === b.hosts[i][2] && h[3] === b.hosts[i][3]);
}

function showStore(answer) {
  const banner = $("banner");
  const down = answer.store || (answer.status === 503 ? answer.doc.message : null);
  $("store").textContent = down ? "store unavailable" : "store up";
  banner.hidden = !down;
  if (down) banner.textContent = answer.store ? "Store " + answer.store : "Store unavailable: " + down;
}

// The store's state as an event says it: {url, up, unavailable_since, error}.
function showStreamStore(doc) {
  const store = doc.store || {up: true};
  const banner = $("banner");
  $("store").textContent = store.up ? "store up" : "store unavailable";
  banner.hidden = store.up;
  if (!store.up) {
    banner.textContent = "Store unavailable since " + store.unavailable_since + ": " + (store.error || "") +
      "; showing the last state read";
  }
  $("updated").textContent = "revision " + doc.revision + " · live · " + doc.at;
}

// A grid to draw (the whole fleet's): redraws and rereads the panels when it changed.
function showFleet(doc) {
  if (sameFleet(fleet, doc)) return;
  const first = fleet === null;
  fleet = doc;
  poolOptions(doc.pools);
  heatmap.setFleet(doc);
  if (first) { firstDrawn(); linkedHost(); linkedFilter(); }
  showMatching();
  $("unassigned").replaceChildren(renderUnassigned(doc, openHost));
  $("grid-note").textContent = doc.hosts.length ? "" : "No hosts (apply a policy).";
  scheduleDetails(0);
  if (filterCells && Date.now() - filteredAt > FILTER_REREAD_MS) applyFilters();
}

// Hosts events: the changed hosts' grid rows replace theirs (new ones join in name order).
// A busy fleet changes many times a second: the changes are drawn together every CHANGES_MS.
const CHANGES_MS = 250;
let pendingChanges = [];
function queueChange(change) {
  pendingChanges.push(change);
  if (pendingChanges.length === 1) setTimeout(applyChanges, CHANGES_MS);
}

function applyChanges() {
  const changes = pendingChanges;
  pendingChanges = [];
  if (!fleet || !changes.length) return;
  const rows = new Map(fleet.hosts.map((h) => [h[0], h]));
  let renamed = false;
  for (const change of changes) {
    for (const name of change.removed || []) renamed = rows.delete(name) || renamed;
    for (const row of change.grid || []) { renamed = renamed || !rows.has(row[0]); rows.set(row[0], row); }
  }
  const names = [...rows.keys()];
  if (renamed) names.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const last = changes[changes.length - 1];
  showFleet({...fleet, revision: last.revision, generated_at: last.at, hosts: names.map((n) => rows.get(n))});
}

function openStream() {
  if (typeof EventSource === "undefined") { startPolling(); return; }
  const source = new EventSource("/api/v1/events?snapshot=grid");
  source.addEventListener("fleet", (e) => {
    const doc = JSON.parse(e.data);
    polling = false;
    pendingChanges = [];  // an earlier stream's, older than this grid
    $("heatmap").dataset.feed = "stream";
    showStreamStore(doc);
    if (doc.loaded) showFleet(doc.grid);
    else if (!fleet) $("grid-note").textContent = "Waiting for the first read of the store…";
  });
  source.addEventListener("hosts", (e) => {
    const change = JSON.parse(e.data);
    showStreamStore(change);
    queueChange(change);
  });
  // Fallen behind, or every host rebuilt: the whole grid again, on a new stream.
  source.addEventListener("resync", () => { source.close(); openStream(); });
  source.addEventListener("error", () => {
    source.close();
    $("store").textContent = "live updates lost; reading every " + POLL_MS / 1000 + " s";
    startPolling();
    setTimeout(openStream, STREAM_RETRY_MS);
  });
}

function startPolling() {
  if (polling) return;
  polling = true;
  $("heatmap").dataset.feed = "polling";
  loadFleet();
}

async function loadFleet() {
  if (!polling) return;  // the stream is back
  try {
    const answer = await getJSON("/api/v1/fleet");
    showStore(answer);
    if (!answer.ok) { if (!fleet) $("grid-note").textContent = answer.doc.message; return; }
    $("updated").textContent = "revision " + answer.doc.revision + " · read " + answer.doc.generated_at;
    if (polling) showFleet(answer.doc);
  } catch (err) {
    $("store").textContent = "connection to allocator serve lost; retrying…";
  } finally {
    if (polling) setTimeout(loadFleet, POLL_MS);
  }
}

// A link to a host's drill-down (/#host=node0001) opens it once the fleet is known.
function linkedHost() {
  const linked = /^#host=(.+)$/.exec(location.hash);
  if (linked) openHost(decodeURIComponent(linked[1]));
}

// When the first whole heatmap was on screen: a mark, and the canvas's data-first-draw-ms.
function firstDrawn() {
  requestAnimationFrame(() => {
    performance.mark("heatmap-drawn");
    $("heatmap").dataset.firstDrawMs = performance.now().toFixed(1);
  });
}

function poolOptions(pools) {
  const select = $("f-pool"), chosen = select.value;
  const names = pools.map((p) => el("option", {value: p}, p));
  select.replaceChildren(el("option", {value: ""}, "any"), ...names);
  select.value = pools.includes(chosen) ? chosen : "";
  const states = $("f-state");
  if (states.options.length === 1) {
    states.append(...fleet.states.map((s) => el("option", {value: s}, STATE_WORDS[s] || s)));
  }
}

function showMatching() {
  const filtered = heatmap.matching !== heatmap.cells;
  const legend = $("legend");
  legend.replaceChildren(...renderLegend(fleet.states, heatmap.counts, heatmap.matched, filtered));
  paintSwatches(legend);
  $("matching").textContent = filtered
    ? heatmap.matching.toLocaleString("en-US") + " of " + heatmap.cells.toLocaleString("en-US") + " GPUs match"
    : heatmap.cells.toLocaleString("en-US") + " GPUs on " + fleet.hosts.length.toLocaleString("en-US") + " hosts";
}

// A link to a user's jobs (/#user=alice) filters the heatmap to them.
function linkedFilter() {
  const linked = /^#user=(.+)$/.exec(location.hash);
  if (!linked) return;
  $("f-user").value = decodeURIComponent(linked[1]);
  applyFilters();
  $("heatmap").scrollIntoView({block: "nearest"});
}
window.addEventListener("hashchange", linkedFilter);

// --- panels read when the fleet changed (at most every 2 s) and every DETAILS_MS -------------

// At most one read of the panels every POLL_MS: a change during one is read right after it.
let detailsAgain = false;
function scheduleDetails(delay) {
  if (detailsTimer) { detailsAgain = true; return; }
  detailsTimer = setTimeout(async () => {
    await Promise.all([loadSummary(), loadFree(), loadBroken(), loadIdle(), loadGroups(), loadQueue(),
      refreshHost(), loadHistory()]);
    setTimeout(() => {
      detailsTimer = null;
      if (detailsAgain) { detailsAgain = false; scheduleDetails(0); }
    }, POLL_MS);
  }, delay);
}
setInterval(() => scheduleDetails(0), DETAILS_MS);

async function panel(id, path, render) {
  try {
    const answer = await getJSON(path);
    const shown = [].concat(answer.ok ? render(answer) : muted(answer.doc.message));
    $(id).replaceChildren(...shown.filter((node) => node !== null && node !== undefined));
  } catch (err) {
    $(id).replaceChildren(muted("Unavailable: " + err));
  }
}

const loadSummary = () => panel("summary", "/api/v1/summary", (a) => renderSummary(a.doc));
const loadQueue = () => panel("queue", "/api/v1/queue", (a) => renderQueue(a.doc));
const loadGroups = () => panel("groups", "/api/v1/status?per_page=1",
  (a) => renderGroups(a.doc.jobs_across_hosts || [], openHost));
const loadIdle = () => panel("idle", "/api/v1/status?state=idle&per_page=10",
  (a) => { lastIdle = a; return renderIdle(a.doc, a.served, openHost); });
const loadFree = () => {
  const pool = $("f-pool").value;
  const query = "/api/v1/free?limit=" + LIST_ROWS + (pool ? "&pool=" + encodeURIComponent(pool) : "");
  $("free-of").textContent = pool ? "in pool " + pool : "in every pool";
  return panel("free", query, (a) => renderFree(a.doc, openHost));
};
const loadBroken = () => panel("broken", "/api/v1/broken?limit=" + LIST_ROWS, (a) => {
  $("broken-count").textContent = "(" + a.doc.gpus_total.toLocaleString("en-US") + " unhealthy GPUs, " +
    a.doc.agents_total.toLocaleString("en-US") + " agents not up)";
  return renderBroken(a.doc, openHost);
});
// Top users and teams over the window chosen: one row each, their jobs counted, not named.
const loadUsage = () => {
  const span = $("usage-window").value, query = "/api/v1/usage?jobs=count&limit=10&since=" + span;
  return Promise.all([
    panel("top-users", query + "&by=user", (a) => renderTop(a.doc, "user")),
    panel("top-teams", query + "&by=team", (a) => renderTop(a.doc, "team")),
  ]);
};
$("usage-window").addEventListener("change", () => loadUsage());

// --- host drill-down ---------------------------------------------------------------------

async function openHost(name, gpu) {
  openName = name; lastHost = null;
  history.replaceState(null, "", "#host=" + encodeURIComponent(name));  // a link to this view
  heatmap.select(name, gpu);
  $("host-panel").hidden = false;
  $("host-title").textContent = name;
  $("host-body").replaceChildren(muted("Loading…"));
  await refreshHost();
  $("host-panel").scrollIntoView({block: "nearest"});
}

async function refreshHost() {
  if (!openName) return;
  const name = openName;
  const answer = await getJSON("/api/v1/hosts/" + encodeURIComponent(name));
  if (name !== openName) return;
  if (!answer.ok) { $("host-body").replaceChildren(muted(answer.doc.message)); lastHost = null; return; }
  lastHost = answer;
  drawHost();
}

function drawHost() {
  const host = lastHost && (lastHost.doc.hosts || [])[0];
  if (host) $("host-body").replaceChildren(...renderHost(host, lastHost.served).filter(Boolean));
}

$("host-close").addEventListener("click", () => {
  openName = null; lastHost = null; $("host-panel").hidden = true; heatmap.focus = null; heatmap.showCursor();
  history.replaceState(null, "", location.pathname);
});
$("host-history").addEventListener("click", () => {
  historyHost = openName; $("history-panel").open = true; historyTimer = null; loadHistory();
  $("history-panel").scrollIntoView({block: "nearest"});
});

// Times move on between answers: redraw what shows idle times.
setInterval(() => {
  drawHost();
  if (lastIdle && lastIdle.ok) $("idle").replaceChildren(renderIdle(lastIdle.doc, lastIdle.served, openHost));
}, REDRAW_MS);

// --- search and filters ------------------------------------------------------------------

// GPUs held by job `job` and/or by user `user` (a comma list: a team's members): Map(host ->
// Set(GPU position)), read from the status document's pages (job= filtered by serve; a user's
// jobs by who set them).
async function holderCells(job, user) {
  const query = job ? "job=" + encodeURIComponent(job) : "host=*";  // a user's: any host
  const cells = new Map();
  for (let page = 1, pages = 1; page <= pages; page++) {
    const answer = await getJSON("/api/v1/status?" + query + "&per_page=" + STATUS_PAGE + "&page=" + page);
    if (!answer.ok) throw new Error(answer.doc.message);
    pages = answer.doc.page ? answer.doc.page.pages : 1;
    for (const h of answer.doc.hosts) collectHost(h, job, user, cells);
  }
  return cells;
}

function collectHost(h, job, user, cells) {
  const users = user.split(",").map((u) => u.trim()).filter(Boolean);  // a team's members
  const byUser = (by) => some(by) && users.some((u) => by === u || by.startsWith(u + "@"));
  const theirs = new Set(h.jobs.filter((j) => !user || byUser(j.by)).map((j) => j.job));
  // A filtered document lists only the rows that match: a GPU's cell is found by its index
  // (the grid has one cell per GPU row, in order; a MIG row, by its place among these).
  h.gpus.filter((g) => g.gpu !== "cpu").forEach((g, place) => {
    const position = /^[0-9]+$/.test(g.gpu) ? Number(g.gpu) : place;
    const jobs = holderJobs(g.holder);
    const held = jobs.some((j) => (!job || j === job) && theirs.has(j));
    const stray = user && !job && (g.unassigned || []).some((p) => users.includes(p.user));
    if (!held && !stray) return;
    if (!cells.has(h.host)) cells.set(h.host, new Set());
    cells.get(h.host).add(position);
  });
}

async function applyFilters() {
  if (!fleet) return;
  const run = ++filterRun;
  const job = $("f-job").value.trim(), user = $("f-user").value.trim();
  const pool = $("f-pool").value, state = $("f-state").value;
  let cells = null;
  try {
    cells = job || user ? await holderCells(job, user) : null;
  } catch (err) {
    $("matching").textContent = String(err.message || err);
    return;
  }
  if (run !== filterRun) return;  // a newer filter is on its way
  filterCells = cells; filteredAt = Date.now();
  heatmap.setFilter({
    host: hostMatcher($("f-host").value),
    pool: pool ? fleet.pools.indexOf(pool) : null,
    state: state ? fleet.states.indexOf(state) : null,
    cells,
  });
  showMatching();
  // What is applied, for whoever reads the canvas: "state=held&job=train" ("" for none).
  const applied = {host: $("f-host").value.trim(), pool, state, job, user};
  $("heatmap").dataset.filter = Object.entries(applied).filter(([, v]) => v).map(([k, v]) => k + "=" + v).join("&");
  if (lastSeries) plots.update(lastSeries, pool);
  loadFree();
}

let filterTimer = null;
// A link to a user's jobs no longer says what is shown (and the same link works again).
function unlinkFilter() {
  if (location.hash.startsWith("#user=")) history.replaceState(null, "", location.pathname);
}
function filtersChanged() {
  unlinkFilter();
  clearTimeout(filterTimer);
  filterTimer = setTimeout(applyFilters, 250);
}
$("filters").addEventListener("input", filtersChanged);
$("filters").addEventListener("reset", () => { unlinkFilter(); setTimeout(applyFilters, 0); });
$("filters").addEventListener("submit", (e) => e.preventDefault());

// Enter in the host field opens the host named, or the first one the pattern matches.
$("f-host").addEventListener("keydown", (e) => {
  if (e.key !== "Enter" || !fleet) return;
  e.preventDefault();
  const text = $("f-host").value.trim(), matches = hostMatcher(text);
  const found = fleet.hosts.find((h) => h[0] === text) || (matches && fleet.hosts.find((h) => matches(h[0])));
  if (found) openHost(found[0]); else $("matching").textContent = "No host matches " + text;
  applyFilters();
});
document.addEventListener("keydown", (e) => {
  if (e.key === "/" && !/^(INPUT|SELECT|TEXTAREA)$/.test(document.activeElement.tagName)) {
    e.preventDefault(); $("f-host").focus();
  }
});
let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => { if (fleet) heatmap.draw(); }, 200);
});

// --- plots, usage, history -----------------------------------------------------------------

let lastSeries = null;
async function loadSeries() {
  let wait = 10000;
  try {
    const answer = await getJSON("/api/v1/series");
    if (answer.ok) {
      lastSeries = answer.doc;
      wait = Math.max(2000, (answer.doc.interval_seconds || 10) * 1000);
      plots.update(answer.doc, $("f-pool").value);
    } else {
      $("plots").replaceChildren(muted(answer.doc.message));
    }
  } catch (err) {
    $("plots").replaceChildren(muted("Plots unavailable: " + err));
  } finally {
    setTimeout(loadSeries, wait);
  }
}

// Top users and teams: serve reads the usage rollup at most every 30 s; the page asks every 60 s.
function usageLoop() { loadUsage().finally(() => setTimeout(usageLoop, 60000)); }

// History is read from the store on request: only while its panel is open, at most every 5 s.
let historyHost = null, historyTimer = null;
async function loadHistory() {
  if (!$("history-panel").open || historyTimer) return;
  historyTimer = setTimeout(() => { historyTimer = null; }, 5000);
  const query = "/api/v1/history?limit=50" + (historyHost ? "&host=" + encodeURIComponent(historyHost) : "");
  $("history-of").textContent = historyHost ? "of " + historyHost : "";
  await panel("history", query, (a) => renderHistory(a.doc));
}
$("history-panel").addEventListener("toggle", () => {
  if (!$("history-panel").open) historyHost = null;
  loadHistory();
});

openStream();
loadSeries();
usageLoop();
