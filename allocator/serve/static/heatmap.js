// The fleet's heatmap: one cell per GPU on one canvas, hosts grouped by pool.
// A 12,500-host fleet is 100,000 cells: drawn as rectangles, never as DOM nodes. What was
// drawn is written on the canvas's data- attributes (cells, matching, counts by state).
"use strict";

const STATE_COLOURS = {
  free: "#4ac26b", held: "#218bff", idle: "#d4a72c", unhealthy: "#cf222e",
  fallback: "#8250df", unassigned: "#bf3989", reserved: "#8c959f", unknown: "#d0d7de",
};
const STATE_WORDS = {
  free: "free", held: "held", idle: "held, idle", unhealthy: "unhealthy",
  fallback: "held on a fallback", unassigned: "unassigned use", reserved: "reserved, free",
  unknown: "unknown",
};
const LABEL_HEIGHT = 18;
const HOST_LABEL = 14;    // a line above each host's cells for its name, when cells are this big:
const NAMED_SIZE = 10;    // a small fleet's; at fleet scale the tooltip and the search name hosts
const NAMED_BLOCK = 84;   // the least width of a named host's block, for its name
const MAX_HEIGHT = 900;   // the cell size is the largest that fits the fleet in this height
const DIM = 0.82;         // how far a cell that does not match is faded towards white

// "agent alive", "agent gone"; a host no agent ever reported from: "no agent", not "agent none".
function agentWords(agent) {
  return agent === "none" ? "no agent" : "agent " + agent;
}

function dimmed(hex) {
  const n = parseInt(hex.slice(1), 16);
  const fade = (c) => Math.round(c + (255 - c) * DIM);
  const rgb = [(n >> 16) & 255, (n >> 8) & 255, n & 255].map(fade);
  return "#" + rgb.map((c) => c.toString(16).padStart(2, "0")).join("");
}

// "#rrggbb" as one opaque pixel of an ImageData's Uint32Array (little-endian: ABGR).
function pixel(hex) {
  const n = parseInt(hex.slice(1), 16);
  return ((255 << 24) | ((n & 255) << 16) | (n & 0xff00) | ((n >> 16) & 255)) >>> 0;
}

class Heatmap {
  constructor(canvas, tooltip, cursor, onPick) {
    this.canvas = canvas; this.tooltip = tooltip; this.cursor = cursor; this.onPick = onPick;
    this.fleet = null; this.filter = {}; this.focus = null; this.sections = [];
    canvas.addEventListener("mousemove", (e) => this.hover(e));
    canvas.addEventListener("mouseleave", () => { this.tooltip.hidden = true; });
    canvas.addEventListener("click", (e) => {
      const hit = this.hitAt(e.offsetX, e.offsetY);
      if (hit) { this.focus = hit; this.onPick(this.fleet.hosts[hit.host][0], hit.gpu); }
    });
    canvas.addEventListener("keydown", (e) => this.key(e));
  }

  setFleet(fleet) {
    this.fleet = fleet;
    this.stateIndex = Object.fromEntries(fleet.states.map((s, i) => [s, i]));
    const colours = fleet.states.map((s) => STATE_COLOURS[s] || STATE_COLOURS.unknown);
    this.palette = [...colours, ...colours.map(dimmed)];
    this.byName = new Map(fleet.hosts.map((h, i) => [h[0], i]));
    this.draw();
  }

  // filter: {host: name -> bool, pool: index, state: index, cells: Map(host -> Set(gpu))}; any null.
  setFilter(filter) { this.filter = filter; if (this.fleet) this.draw(); }

  layout() {
    const hosts = this.fleet.hosts;
    const width = Math.max(200, this.canvas.parentElement.clientWidth);
    const groups = new Map();
    for (let i = 0; i < hosts.length; i++) {
      const pool = hosts[i][1];
      if (!groups.has(pool)) groups.set(pool, []);
      groups.get(pool).push(i);
    }
    const order = [...groups.keys()].sort((a, b) => (a < 0) - (b < 0) || a - b);
    const gpus = hosts.reduce((most, h) => Math.max(most, h[3].length), 1);
    let size = 24, pitch, block, perRow, height;
    for (; size >= 2; size--) {
      pitch = size + (size > 8 ? 2 : 1);
      block = gpus * pitch + Math.max(3, pitch);
      perRow = Math.max(1, Math.floor(width / block));
      height = order.reduce((sum, p) => sum + LABEL_HEIGHT + Math.ceil(groups.get(p).length / perRow) * pitch, 0);
      if (height <= MAX_HEIGHT) break;
    }
    size = Math.max(size, 2);
    if (height > MAX_HEIGHT) {  // 25,000 hosts and more: 2-px cells touch, only hosts' blocks keep a gap
      pitch = size;
      block = gpus * pitch + 3;
      perRow = Math.max(1, Math.floor(width / block));
    }
    const named = size >= NAMED_SIZE;
    if (named) { block = Math.max(block, NAMED_BLOCK); perRow = Math.max(1, Math.floor(width / block)); }
    const rowPitch = pitch + (named ? HOST_LABEL : 0), cellTop = named ? HOST_LABEL : 0;
    let y = 0;
    this.sections = order.map((pool) => {
      const list = groups.get(pool);
      const section = {pool, hosts: list, label: y, top: y + LABEL_HEIGHT};
      y = section.top + Math.ceil(list.length / perRow) * rowPitch;
      section.bottom = y;
      return section;
    });
    this.place = new Int32Array(hosts.length * 2);  // each host's section and position in it
    this.sections.forEach((s, n) => s.hosts.forEach((h, k) => { this.place[2 * h] = n; this.place[2 * h + 1] = k; }));
    Object.assign(this, {size, pitch, block, perRow, width, named, rowPitch, cellTop, height: Math.max(y, 1)});
  }

  hostMatches(i) {
    const f = this.filter, h = this.fleet.hosts[i];
    if (f.pool !== null && f.pool !== undefined && h[1] !== f.pool) return false;
    return !f.host || f.host(h[0]);
  }

  // Cells are written as pixels into one image (100,000 rectangles through the 2D context
  // cost a tenth of a second; the pixels, a few milliseconds), the pool labels drawn over it.
  draw() {
    const started = performance.now();
    this.layout();
    const dpr = window.devicePixelRatio || 1, canvas = this.canvas;
    const width = Math.round(this.width * dpr), height = Math.round(this.height * dpr);
    canvas.width = width; canvas.height = height;
    canvas.style.width = this.width + "px"; canvas.style.height = this.height + "px";
    const ctx = canvas.getContext("2d", {alpha: false});
    const image = ctx.createImageData(width, height), pixels = new Uint32Array(image.data.buffer);
    pixels.fill(0xffffffff);
    const counts = new Array(this.fleet.states.length).fill(0), matched = counts.slice();
    const {hosts, pools, states: names} = this.fleet, f = this.filter, states = f.state ?? null;
    const side = Math.max(1, Math.round(this.size * dpr)), colours = this.palette.map(pixel);
    let cells = 0, matching = 0;
    for (const section of this.sections) {
      section.hosts.forEach((i, k) => {
        const x0 = (k % this.perRow) * this.block;
        const y = section.top + Math.floor(k / this.perRow) * this.rowPitch + this.cellTop;
        const row = hosts[i], text = row[3], hostOk = this.hostMatches(i);
        const chosen = f.cells ? f.cells.get(row[0]) : null;
        const top = Math.round(y * dpr) * width;
        for (let g = 0; g < text.length; g++) {
          const state = text.charCodeAt(g) - 48;
          const ok = hostOk && (states === null || state === states) && (!f.cells || (chosen && chosen.has(g)));
          const colour = colours[ok ? state : state + names.length];
          const left = top + Math.round((x0 + g * this.pitch) * dpr);
          for (let line = 0; line < side; line++) pixels.fill(colour, left + line * width, left + line * width + side);
          counts[state]++; cells++;
          if (ok) { matched[state]++; matching++; }
        }
      });
    }
    ctx.putImageData(image, 0, 0);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#1f2328"; ctx.font = "600 12px system-ui, sans-serif";
    for (const section of this.sections) {
      const name = section.pool < 0 ? "no pool" : pools[section.pool];
      const count = section.hosts.length;
      ctx.fillText(name + " · " + count.toLocaleString("en-US") + (count === 1 ? " host" : " hosts"), 0, section.label + 13);
    }
    const labels = this.drawNames(ctx);
    const byName = (list) => JSON.stringify(Object.fromEntries(names.map((s, n) => [s, list[n]])));
    Object.assign(canvas.dataset, {cells, matching, hosts: hosts.length, hostLabels: labels,
      states: byName(counts), matched: byName(matched),
      drawMs: (performance.now() - started).toFixed(1)});
    this.counts = counts; this.matched = matched; this.matching = matching; this.cells = cells;
    this.showCursor();
  }

  // Each host's name above its cells, cut to its block's width; how many were written.
  drawNames(ctx) {
    if (!this.named) return 0;
    ctx.font = "11px system-ui, sans-serif";
    const room = this.block - 6;
    let written = 0;
    for (const section of this.sections) {
      for (const i of section.hosts) {
        let name = this.fleet.hosts[i][0];
        while (name.length > 1 && ctx.measureText(name).width > room) name = name.slice(0, -2) + "…";
        const box = this.labelBox(i);
        ctx.fillText(name, box.x, box.y + 11);
        written++;
      }
    }
    return written;
  }

  // Where host i's name goes (a small fleet's), in CSS pixels.
  labelBox(i) {
    const section = this.sections[this.place[2 * i]], k = this.place[2 * i + 1];
    const y = section.top + Math.floor(k / this.perRow) * this.rowPitch;
    return {x: (k % this.perRow) * this.block, y, w: this.block - 6, h: HOST_LABEL};
  }

  // The box of host i's GPU g on the canvas, in CSS pixels.
  cellBox(i, g) {
    const section = this.sections[this.place[2 * i]], k = this.place[2 * i + 1];
    const x = (k % this.perRow) * this.block + g * this.pitch;
    const y = section.top + Math.floor(k / this.perRow) * this.rowPitch + this.cellTop;
    return {x, y, w: this.size, h: this.size};
  }

  hitAt(x, y) {
    if (!this.fleet) return null;
    const section = this.sections.find((s) => y >= s.top && y < s.bottom);
    if (!section) return null;
    const column = Math.floor(x / this.block);
    if (column >= this.perRow) return null;
    const row = Math.floor((y - section.top) / this.rowPitch);
    if (y - section.top - row * this.rowPitch < this.cellTop) return null;  // a host's name
    const k = row * this.perRow + column;
    const g = Math.floor((x - column * this.block) / this.pitch);
    const host = section.hosts[k];
    if (host === undefined || g >= this.fleet.hosts[host][3].length) return null;
    return {host, gpu: g};
  }

  describe(hit) {
    const [name, pool, agent, text] = this.fleet.hosts[hit.host];
    const state = this.fleet.states[text.charCodeAt(hit.gpu) - 48] || "unknown";
    const poolName = pool < 0 ? "no pool" : this.fleet.pools[pool];
    return name + " · GPU " + hit.gpu + " · " + (STATE_WORDS[state] || state) + " · " + poolName + " · " + agentWords(agent);
  }

  hover(e) {
    const hit = this.hitAt(e.offsetX, e.offsetY);
    if (!hit) { this.tooltip.hidden = true; return; }
    this.showTip(hit, e.offsetX + 14, e.offsetY + 14);
  }

  showTip(hit, x, y) {
    this.tooltip.textContent = this.describe(hit);
    this.tooltip.hidden = false;
    const left = Math.min(x, Math.max(0, this.width - this.tooltip.offsetWidth));
    this.tooltip.style.left = left + "px"; this.tooltip.style.top = y + "px";
  }

  showCursor() {
    const hit = this.focus;
    if (!hit || !this.fleet || hit.host >= this.fleet.hosts.length) { this.cursor.hidden = true; return; }
    const box = this.cellBox(hit.host, hit.gpu);
    Object.assign(this.cursor.style, {left: box.x - 2 + "px", top: box.y - 2 + "px",
      width: box.w + 2 + "px", height: box.h + 2 + "px"});
    this.cursor.hidden = false;
  }

  // Arrow keys move the focused cell, Enter opens its host; the tooltip says what it is.
  key(e) {
    if (!this.fleet || !this.fleet.hosts.length) return;
    const moves = {ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-this.perRow, 0], ArrowDown: [this.perRow, 0]};
    if (e.key === "Enter" && this.focus) { this.onPick(this.fleet.hosts[this.focus.host][0], this.focus.gpu); return; }
    if (!(e.key in moves)) return;
    e.preventDefault();
    const hit = this.focus || {host: this.sections[0].hosts[0], gpu: 0};
    const section = this.sections[this.place[2 * hit.host]];
    let k = this.place[2 * hit.host + 1] + moves[e.key][0], g = hit.gpu + moves[e.key][1];
    const gpus = (i) => this.fleet.hosts[i][3].length;
    if (g < 0 && k > 0) { k--; g = gpus(section.hosts[k]) - 1; }
    k = Math.min(Math.max(k, 0), section.hosts.length - 1);
    if (g >= gpus(section.hosts[k])) { if (k + 1 < section.hosts.length) { k++; g = 0; } else g--; }
    this.focus = {host: section.hosts[k], gpu: Math.max(0, g)};
    this.showCursor();
    const box = this.cellBox(this.focus.host, this.focus.gpu);
    this.showTip(this.focus, box.x + 14, box.y + 14);
  }

  // Put the cursor on host `name` (a search or a drill-down); false when there is none.
  select(name, gpu) {
    const i = this.byName ? this.byName.get(name) : undefined;
    if (i === undefined) return false;
    this.focus = {host: i, gpu: gpu || 0};
    this.showCursor();
    return true;
  }
}
