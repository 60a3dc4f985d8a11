// Utilisation: CPU, resident memory and (when NVML reports them) GPU utilisation and memory
// of every rank over time, and the latest sample of each of the job's nodes. A job of more
// than 16 ranks is drawn per node (the mean of its ranks) so the charts stay readable.
"use strict";

(function () {
  const { el, clear, api, fmtBytes, fmtPercent, fmtClock } = window.MY;
  const MAX_PER_RANK = 2000, MAX_LINES = 16;
  const byRank = new Map(); // rank -> [{at, cpu_percent, rss_bytes, gpu_util, gpu_mem_bytes, node}]
  let since = 0, attempt = null, nodesAt = 0, nodesKey = "";

  function series(key) {
    const ranks = [...byRank.keys()].sort((a, b) => a - b);
    if (ranks.length <= MAX_LINES) {
      return ranks.map((r) => ({ name: "rank " + r, points: byRank.get(r)
        .filter((p) => p[key] !== null).map((p) => ({ x: p.at, y: p[key] })) }));
    }
    const nodes = new Map(); // node -> bucketed mean over its ranks
    for (const r of ranks) {
      for (const p of byRank.get(r)) {
        if (p[key] === null) continue;
        const name = p.node || "?";
        if (!nodes.has(name)) nodes.set(name, new Map());
        const b = Math.round(p.at / 10) * 10, m = nodes.get(name);
        const cur = m.get(b) || { s: 0, n: 0 };
        cur.s += p[key]; cur.n += 1; m.set(b, cur);
      }
    }
    return [...nodes].map(([name, m]) => ({ name, points: [...m].sort((a, b) => a[0] - b[0])
      .map(([x, v]) => ({ x, y: v.s / v.n })) }));
  }

  function draw(ctx) {
    const line = window.MYCharts.line;
    const note = document.getElementById("usage-note");
    note.textContent = !byRank.size ? "no samples yet: every rank reports CPU, memory and GPU " +
      "every few seconds while it runs" : byRank.size > MAX_LINES ? "per node (mean of its ranks)" : "per rank";
    document.getElementById("usage-charts").hidden = !byRank.size;
    line(document.getElementById("chart-cpu"), series("cpu_percent"),
      { xKind: "time", zeroBased: true, fmt: (v) => Math.round(v) + "%", empty: "no samples yet" });
    line(document.getElementById("chart-mem"), series("rss_bytes"),
      { xKind: "time", zeroBased: true, fmt: fmtBytes, empty: "no samples yet" });
    const gpu = [...byRank.values()].some((ps) => ps.some((p) => p.gpu_util !== null));
    document.getElementById("fig-gpu").hidden = !gpu;
    document.getElementById("fig-gpumem").hidden = !gpu;
    if (gpu) {
      line(document.getElementById("chart-gpu"), series("gpu_util"),
        { xKind: "time", zeroBased: true, fmt: (v) => Math.round(v) + "%" });
      line(document.getElementById("chart-gpumem"), series("gpu_mem_bytes"),
        { xKind: "time", zeroBased: true, fmt: fmtBytes });
    }
    ctx.usage = new Map([...byRank].map(([r, ps]) => [r, ps[ps.length - 1]]));
  }

  async function loadNodes(ctx) {
    const names = new Set(ctx.ranks.map((r) => r.node).filter(Boolean));
    const body = document.getElementById("usage-nodes-body");
    if (!names.size) { clear(body); body.appendChild(el("tr", {}, el("td", { colspan: "5", class: "muted" }, "no ranks placed yet"))); return; }
    const data = await api("/v1/cluster/usage?since=" + (Date.now() / 1000 - 600).toFixed(0) + "&limit=2000");
    const latest = new Map();
    for (const p of data.items) if (names.has(p.node)) latest.set(p.node, p);
    clear(body);
    for (const name of [...names].sort()) {
      const p = latest.get(name);
      const gpus = p && p.gpus.length ? p.gpus.map((g) => `GPU ${g.index}: ${fmtPercent(g.util)}, ${fmtBytes(g.mem_used_bytes)}`).join(" · ") : (p ? "no NVML GPUs" : "");
      body.appendChild(el("tr", { dataset: { node: name } }, el("td", {}, name),
        el("td", { class: "num" }, p ? fmtPercent(p.cpu_percent) : "—"),
        el("td", { class: "num" }, p ? fmtBytes(p.mem_used_bytes) + " / " + fmtBytes(p.mem_total_bytes) : "—"),
        el("td", { class: "small" }, gpus || "—"), el("td", {}, p ? fmtClock(p.at) : "not sampled yet")));
    }
  }

  window.MYJob.register({
    name: "usage",
    early: true,
    async tick(ctx) {
      const n = ctx.job.current_attempt;
      if (n !== attempt) { byRank.clear(); since = 0; attempt = n; }
      const data = await api(ctx.base + "/usage?attempt=" + Math.max(n, 1) + "&since=" + since + "&limit=20000");
      for (const p of data.items) {
        if (!byRank.has(p.rank)) byRank.set(p.rank, []);
        const list = byRank.get(p.rank);
        list.push(p);
        if (list.length > MAX_PER_RANK) list.splice(0, list.length - MAX_PER_RANK);
        since = Math.max(since, p.at);
      }
      if (data.items.length || !document.querySelector("#chart-cpu svg")) draw(ctx);
      const key = [...new Set(ctx.ranks.map((r) => r.node))].sort().join(",");
      if (key !== nodesKey || Date.now() - nodesAt > 10000) {
        nodesAt = Date.now();
        nodesKey = key;
        await loadNodes(ctx);
      }
    },
  });
})();
