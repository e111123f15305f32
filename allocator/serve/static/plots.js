// Plots over time, drawn by uPlot (vendored) from /api/v1/series: GPUs held, idle, free and
// unhealthy in all and per pool, mean utilisation, queue length. Each figure says in data-
// attributes how many points it drew and the last values, so tests can read what is shown.
"use strict";

const PLOT_POOLS = 6;  // more pools than this: the total only (the pool filter picks one)
const GPU_SERIES = ["held", "idle", "free", "unhealthy"];
const GPU_COLOURS = {held: STATE_COLOURS.held, idle: STATE_COLOURS.idle, free: STATE_COLOURS.free,
                     unhealthy: STATE_COLOURS.unhealthy};

class Plots {
  constructor(box) { this.box = box; this.charts = new Map(); this.key = ""; }

  // The figures to draw: [id, caption, series labels, colours, data columns].
  figures(doc, pool) {
    const pools = Object.keys(doc.pools || {}).sort();
    const shown = pool && doc.pools[pool] ? [pool] : pools.length <= PLOT_POOLS ? pools : [];
    const gpus = (id, caption, counts) => [id, caption, GPU_SERIES, GPU_SERIES.map((s) => GPU_COLOURS[s]),
      GPU_SERIES.map((s) => (counts && counts[s]) || [])];
    return [
      gpus("total", "GPUs, all pools", doc.total),
      ...shown.map((p) => gpus("pool-" + p, "GPUs, pool " + p, doc.pools[p])),
      ["utilisation", "GPU utilisation (mean %)", ["utilisation"], ["#0969da"], [doc.utilisation_percent || []]],
      ["queue", "Queued requests", ["queued"], ["#8250df"], [doc.queue || []]],
    ];
  }

  update(doc, pool) {
    const figures = this.figures(doc, pool);
    const key = figures.map((f) => f[0]).join(",");
    if (key !== this.key) { this.build(figures); this.key = key; }
    const t = doc.t || [];
    for (const [id, , labels, , columns] of figures) {
      const {chart, figure} = this.charts.get(id);
      chart.setData([t, ...columns.map((c) => c.slice(-t.length))]);
      figure.dataset.points = t.length;
      const none = columns.every((c) => c.every((v) => v === null || v === undefined));
      figure.querySelector("figcaption").dataset.none = none && t.length ? "yes" : "no";
      figure.dataset.last = JSON.stringify(Object.fromEntries(labels.map((l, i) => [l, columns[i].at(-1) ?? null])));
    }
  }

  build(figures) {
    for (const {chart} of this.charts.values()) chart.destroy();
    this.charts.clear();
    const width = Math.max(280, Math.min(420, Math.floor((this.box.clientWidth - 32) / 3)));
    const nodes = figures.map(([id, caption, labels, colours]) => {
      const figure = el("figure", {"data-plot": id}, el("figcaption", {}, caption));
      const options = {
        width, height: 170, legend: {show: true}, cursor: {drag: {x: false, y: false}},
        scales: {x: {time: true}, y: {range: (u, low, high) => [0, Math.max(1, high)]}},
        axes: [{}, {size: 56, values: (u, ticks) => ticks.map((v) => v.toLocaleString("en-US"))}],
        series: [{}, ...labels.map((label, i) => ({label, stroke: colours[i], width: 1.5, spanGaps: false}))],
      };
      const chart = new uPlot(options, [[], ...labels.map(() => [])], figure);
      this.charts.set(id, {chart, figure});
      return figure;
    });
    this.box.replaceChildren(...nodes);
  }
}
