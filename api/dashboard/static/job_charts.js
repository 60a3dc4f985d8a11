// Training charts: every metric the job reports, from the server's downsampled series
// (GET .../metrics/series: at most POINTS buckets per series, each with its mean, min and
// max, so a spike survives as its bucket's band). The fixed figures (loss, throughput, learning
// rate, gradient norm; gradient bytes, compression ratio and MoE loss when reported), then one
// figure per other reported key; a key named val_X or eval_X is drawn in X's figure against
// it. "every rank" overlays ranks 0-7; a step range (typed, or dragged across a chart) zooms
// every figure, and a range of fewer steps than POINTS comes back row by row.
"use strict";

(function () {
  const { api, el, clear, fmtBytes } = window.MY;
  const POINTS = 300, MAX_RANKS = 8, KEYS_PER_REQUEST = 32;
  // Fixed figures: key -> [figure id (null: always shown), chart id, options].
  const FIXED = {
    loss: [null, "chart-loss", { cls: "loss", empty: "no loss reported yet" }],
    tokens_per_s: [null, "chart-tput", { cls: "tput", zeroBased: true, empty: "no throughput reported yet" }],
    lr: [null, "chart-lr", { cls: "lr", empty: "the loop reports no learning rate" }],
    grad_norm: [null, "chart-grad", { cls: "grad", empty: "the loop reports no gradient norm" }],
    grad_comm_bytes: ["fig-comm", "chart-comm", { cls: "grad", zeroBased: true, fmt: fmtBytes }],
    grad_compression_ratio: ["fig-ratio", "chart-ratio", { cls: "tput", zeroBased: true, fmt: (v) => v.toFixed(2) + "x" }],
    moe_aux_loss: ["fig-aux", "chart-aux", { cls: "loss" }],
  };
  const CAPTIONS = { step_time_s: "Step time (s)" };
  const FIXED_KEYS = [...Object.keys(FIXED), "step_time_s"];
  const VAL = /^(val|eval)_(.+)$/;
  const grid = document.getElementById("charts-grid");
  const xSel = document.getElementById("chart-x");
  const logBox = document.getElementById("chart-log");
  const ranksBox = document.getElementById("chart-ranks");
  const fromIn = document.getElementById("chart-from");
  const toIn = document.getElementById("chart-to");
  const reset = document.getElementById("chart-zoom-reset");
  const figs = new Map(); // key -> chart container of a figure made here
  let extra = []; // the job's other metric names, from the last reply
  let series = []; // the last replies' items
  let asked = ""; // what the last load asked: a poll that would ask the same is skipped
  let ctxRef = null;
  let generation = 0; // a reply to an older load than the newest is dropped

  function stepRange() {
    const read = (input) => (input.value === "" || isNaN(+input.value) ? null
      : Math.min(2147483647, Math.max(0, Math.floor(+input.value))));
    return [read(fromIn), read(toIn)];
  }

  function rankList() {
    const job = ctxRef && ctxRef.job;
    const n = ranksBox.checked && job ? Math.max(1, Math.min(job.world_size, MAX_RANKS)) : 1;
    return Array.from({ length: n }, (_, i) => i);
  }

  async function load(force) {
    const job = ctxRef.job || {};
    const keys = [...FIXED_KEYS, ...extra];
    const ranks = rankList();
    const [from, to] = stepRange();
    const ask = JSON.stringify([keys, ranks, from, to, job.last_step, job.state]);
    if (!force && ask === asked) return false;
    asked = ask;
    const mine = ++generation;
    const items = [];
    let names = [];
    for (let i = 0; i < keys.length; i += KEYS_PER_REQUEST) {
      const q = new URLSearchParams({ keys: keys.slice(i, i + KEYS_PER_REQUEST).join(","),
        ranks: ranks.join(","), points: String(POINTS) });
      if (from !== null) q.set("from_step", String(from));
      if (to !== null) q.set("to_step", String(to));
      const reply = await api(ctxRef.base + "/metrics/series?" + q.toString());
      if (mine !== generation) return false;
      items.push(...reply.items);
      names = reply.keys;
    }
    series = items;
    if (names.some((k) => !extra.includes(k))) {
      extra = names.slice();
      return load(true);
    }
    return true;
  }

  function figure(key) {
    let chart = figs.get(key);
    if (!chart) {
      chart = el("div", { class: "chart", role: "img", "aria-label": key });
      grid.appendChild(el("figure", { "data-metric": key },
        el("figcaption", {}, CAPTIONS[key] || key), chart));
      figs.set(key, chart);
    }
    return chart;
  }

  function legend(chart, names) {
    const fig = chart.parentNode;
    let list = fig.querySelector("ul.legend");
    if (names.length < 2) { if (list) list.remove(); return; }
    if (!list) { list = el("ul", { class: "legend small" }); fig.appendChild(list); }
    clear(list);
    names.slice(0, 16).forEach((name, i) => list.appendChild(
      el("li", {}, el("span", { class: "swatch s" + (i % 8), "aria-hidden": "true" }), name)));
  }

  function zoom(from, to) {
    fromIn.value = String(Math.max(0, from));
    toIn.value = String(Math.max(from, to));
    refresh();
  }

  function draw() {
    const xKind = xSel.value;
    // a script that has reported nothing: one line on how to report, not empty panels
    const job = (ctxRef && ctxRef.job) || {};
    const silent = !!(job.spec && job.spec.entrypoint) && !series.some((s) => s.step.length);
    document.getElementById("chart-none").hidden = !silent;
    grid.hidden = silent;
    document.getElementById("chart-note").hidden = silent;
    if (silent) return;
    const byKey = new Map();
    for (const s of series) {
      if (!byKey.has(s.key)) byKey.set(s.key, []);
      byKey.get(s.key).push(s);
    }
    const hosts = new Set([...Object.keys(FIXED), ...byKey.keys()]);
    const groups = new Map(); // figure key -> the keys drawn in it (its own first)
    for (const k of [...FIXED_KEYS, ...extra]) {
      const m = VAL.exec(k);
      const host = m && hosts.has(m[2]) ? m[2] : k;
      if (!groups.has(host)) groups.set(host, []);
      if (byKey.has(k)) groups.get(host).push(k);
    }
    const overlay = rankList().length > 1;
    for (const [host, keys] of groups) {
      const data = [];
      for (const k of keys.sort((a, b) => (a === host ? -1 : b === host ? 1 : a.localeCompare(b)))) {
        for (const s of byKey.get(k)) {
          const name = [keys.length > 1 ? (k === host ? k + " (train)" : k) : "",
            overlay ? "rank " + s.rank : ""].filter(Boolean).join(" · ");
          data.push({ name, points: s.step.map((step, i) => ({ x: xKind === "time" ? s.time[i] : step,
            y: s.mean[i], lo: s.min[i], hi: s.max[i], n: s.count[i] })) });
        }
      }
      const fixed = FIXED[host];
      if (fixed && fixed[0]) document.getElementById(fixed[0]).hidden = !data.length;
      if (!data.length && (!fixed || fixed[0])) continue;
      const chart = fixed ? document.getElementById(fixed[1]) : figure(host);
      window.MYCharts.line(chart, data, { ...(fixed ? fixed[2] : { cls: "loss" }), xKind,
        logY: host === "loss" && logBox.checked, onZoom: zoom });
      legend(chart, data.map((d) => d.name));
    }
    const [from, to] = stepRange();
    reset.hidden = from === null && to === null;
  }

  async function refresh() {
    if (ctxRef && await load(true)) draw();
  }

  xSel.addEventListener("change", draw);
  logBox.addEventListener("change", draw);
  ranksBox.addEventListener("change", refresh);
  fromIn.addEventListener("change", refresh);
  toIn.addEventListener("change", refresh);
  reset.addEventListener("click", () => { fromIn.value = ""; toIn.value = ""; refresh(); });

  window.MYJob.register({
    name: "charts",
    async tick(ctx) {
      ctxRef = ctx;
      if (await load(false) || !document.querySelector("#chart-loss svg")) draw();
    },
  });
})();
