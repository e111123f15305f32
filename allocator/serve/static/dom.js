// The status page's small helpers: elements, tables, times, host patterns.
// Everything shown comes from the store, which anyone may have written: only text, never HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const some = (v) => v !== null && v !== undefined && v !== "" && v !== "-";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function table(headers, rows) {
  const head = el("tr", {}, ...headers.map((h) => el("th", {}, h)));
  return el("table", {}, head, ...rows);
}

function muted(text) { return el("p", {class: "muted"}, text); }

function duration(seconds) {
  const s = Math.floor(seconds), d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600);
  const m = Math.floor(s % 3600 / 60), pad = (n) => String(n).padStart(2, "0");
  if (d) return d + "d" + pad(h) + "h";
  if (h) return h + "h" + pad(m) + "m";
  return m ? m + "m" + pad(s % 60) + "s" : (s % 60) + "s";
}

function place(p) { return p ? (p.mode === "cpu" ? "cpu" : (p.gpus || []).join(",")) : ""; }

// A JSON read: {ok, status, doc, served (the server's clock at the answer, ms), store (header)}.
async function getJSON(path) {
  const response = await fetch(path);
  let doc = null;
  try { doc = await response.json(); } catch (err) { doc = {message: String(err)}; }
  const served = Date.parse(response.headers.get("date") || "");
  return {ok: response.ok, status: response.status, doc,
          served: Number.isNaN(served) ? Date.now() : served,
          store: response.headers.get("x-allocator-store")};
}

// Seconds since the server answered, by the page's clock: idle times shown grow with it.
function since(served) { return Math.max(0, (Date.now() - served) / 1000); }

// The job names in a status row's holder: "infer,train(2)" -> ["infer", "train"].
function holderJobs(holder) {
  if (!some(holder)) return [];
  return holder.split(",").map((h) => h.replace(/\(.*\)$/, "").trim()).filter(Boolean);
}

// A host pattern as the policy writes ranges (node[0000-0099,120]), with * and ? globs;
// without any of them, a part of the name. Returns a predicate on host names.
function hostMatcher(pattern) {
  const text = pattern.trim();
  if (!text) return null;
  if (!/[[*?]/.test(text)) return (name) => name.includes(text);
  const checks = [];
  let source = "^";
  for (const piece of text.split(/(\[[0-9,-]+\])/)) {
    if (/^\[[0-9,-]+\]$/.test(piece)) {
      checks.push(spans(piece.slice(1, -1)));
      source += "([0-9]+)";
    } else {
      source += piece.replace(/[.+^${}()|\\\]\[]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
    }
  }
  const regex = new RegExp(source + "$");
  return (name) => {
    const found = regex.exec(name);
    return found !== null && checks.every((ok, i) => ok(found[i + 1]));
  };
}

// One bracket's spans as a check of the digits found there (a leading zero pads to its width).
function spans(body) {
  const list = body.split(",").filter(Boolean).map((span) => {
    const [first, last = first] = span.split("-");
    const width = first.length > 1 && first.startsWith("0") ? first.length : 0;
    return {low: Number(first), high: Number(last), width};
  });
  return (digits) => list.some(({low, high, width}) => {
    const n = Number(digits);
    return n >= low && n <= high && digits === String(n).padStart(width, "0");
  });
}
