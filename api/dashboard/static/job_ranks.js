// Ranks: the table (state from the open diagnosis while there is one, heartbeat age, latest
// utilisation), the placement map, and the communication signature, redone when ranks move.
"use strict";

(function () {
  const { el, clear, api, ageSeconds, fmtAge, fmtClock, fmtBytes, fmtPercent, TERMINAL } = window.MY;
  const STALE_S = 30;
  const body = document.getElementById("rank-body");
  const filter = document.getElementById("rank-filter");
  const problems = document.getElementById("rank-problems");
  const rows = new Map();
  let mapKey = "", commKey = null, nodes = null, nodesKey = "", ctxRef = null;

  function rowFor(r) {
    const cells = {};
    const tr = el("tr", { id: "rank-" + r.rank });
    for (const k of ["rank", "pp", "dp", "tp", "node", "gpu", "step", "phase", "hb", "state", "cpu", "mem", "gpuu"]) {
      cells[k] = el("td", { class: ["rank", "pp", "dp", "tp", "gpu", "step", "cpu", "mem", "gpuu"].includes(k) ? "num" : "" });
      tr.appendChild(cells[k]);
    }
    return { tr, cells };
  }

  // Which diagnosis culprits apply: those of a diagnosis of the attempt shown.
  function culprits(ctx) {
    const d = ctx.diagnosis;
    return d && ctx.ranks.length && d.attempt === ctx.ranks[0].attempt ? ctx.culprits : new Set();
  }

  // A number filters to that rank; anything else matches node, state or phase text.
  function matches(r, needle) {
    if (!needle) return true;
    if (/^\d+$/.test(needle)) return String(r.rank) === needle;
    const c = r.condition || {};
    return [r.node, r.state, r.phase, c.state, c.collective, "gpu" + r.gpu].join(" ").toLowerCase().includes(needle);
  }

  function update() {
    const ctx = ctxRef;
    if (!ctx) return;
    const size = window.MYPlacement.meshSizes(ctx.ranks);
    const needle = filter.value.trim().toLowerCase();
    const named = culprits(ctx);
    const final = TERMINAL.has(ctx.job && ctx.job.state);
    let shown = 0;
    for (const r of ctx.ranks) {
      let row = rows.get(r.rank);
      if (!row) { row = rowFor(r); rows.set(r.rank, row); body.appendChild(row.tr); }
      const c = r.coords || {};
      const age = ageSeconds(r.last_heartbeat);
      const stale = !final && age !== null && age > STALE_S;
      const u = ctx.usage.get(r.rank);
      const cond = r.condition;
      const values = {
        rank: r.rank, pp: c.pp ?? "–", dp: (c.dp_replicate || 0) * size.dp_shard + (c.dp_shard || 0), tp: c.tp ?? "–",
        node: r.node || "–", gpu: r.gpu ?? "–", phase: r.phase || "–",
        // a script that reports no steps progresses by the collectives its ranks enqueue
        step: !r.step && r.collectives != null ? r.collectives + " coll." : r.step ?? "–",
        // a finished job's clock stops: when its last heartbeat came, not how long ago
        hb: final ? (r.last_heartbeat ? "last " + fmtClock(r.last_heartbeat) : "–") : fmtAge(age),
        state: cond ? cond.state + (cond.collective ? " · " + cond.collective : "")
          : r.state === "PEER_LOST" ? "peer lost" : r.state,
        cpu: u ? fmtPercent(u.cpu_percent) : "–", mem: u ? fmtBytes(u.rss_bytes) : "–",
        gpuu: u && u.gpu_util !== null ? fmtPercent(u.gpu_util) : "–",
      };
      for (const [k, v] of Object.entries(values)) if (row.cells[k].textContent !== String(v)) row.cells[k].textContent = String(v);
      const culprit = named.has(r.rank);
      // a rank that only lost a peer is fallout, not a problem of its own
      const bad = culprit || stale || (r.state !== "PEER_LOST" && /fail|dead|exit|error|lost/i.test(r.state));
      row.tr.className = [culprit ? "culprit" : "", stale ? "stale" : "", bad ? "bad" : "",
        cond ? "cond-" + cond.state : ""].join(" ").trim();
      const visible = matches(r, needle) && (!problems.checked || bad);
      row.tr.hidden = !visible;
      if (visible) shown++;
    }
    document.getElementById("rank-count").textContent = shown + " of " + ctx.ranks.length + " ranks";
  }
  filter.addEventListener("input", update);
  problems.addEventListener("change", update);

  async function loadNodes(names) {
    const key = [...new Set(names)].sort().join(",");
    if (nodes && key === nodesKey) return;
    const [cluster, topo] = await Promise.all([api("/v1/cluster"), api("/v1/cluster/topology")]);
    const found = new Map();
    for (const n of cluster.nodes) found.set(n.name, { labels: n.labels, gpus: n.gpus, topology: {} });
    for (const t of topo.nodes) if (found.has(t.name)) found.get(t.name).topology = t.topology;
    nodes = found; nodesKey = key;
  }

  async function loadComm(ctx) {
    const data = await api("/jobs/" + encodeURIComponent(ctx.jobId) + "/comm.json");
    const note = document.getElementById("comm-note");
    const tbody = document.getElementById("comm-body");
    clear(tbody);
    if (!data.available) { note.textContent = "The cost model cannot read this job's spec."; return; }
    note.textContent = data.note;
    for (const r of data.rows) {
      tbody.appendChild(el("tr", {}, el("td", {}, r.dimension), el("td", { class: "num" }, String(r.participants)),
        el("td", {}, r.primitive), el("td", { class: "num" }, r.bytes_per_call),
        el("td", { class: "num" }, String(r.calls_per_step)), el("td", { class: "num" }, r.overlap),
        el("td", { class: "num" }, r.est_time), el("td", {}, r.bottleneck)));
    }
    if (!data.rows.length) {
      note.textContent = "";
      tbody.appendChild(el("tr", {}, el("td", { colspan: "8", class: "muted" }, data.note || "No communication (one rank).")));
    }
  }

  function select(rank) {
    filter.value = String(rank);
    update();
    const row = document.getElementById("rank-" + rank);
    if (row) row.scrollIntoView({ block: "center" });
  }

  window.MYJob.register({
    name: "ranks",
    async tick(ctx) {
      ctxRef = ctx;
      const data = await api(ctx.base + "/ranks");
      if (ctx.ranks.length && data.items.length && data.items[0].attempt !== ctx.ranks[0].attempt) {
        clear(body); rows.clear();
      }
      ctx.ranks = data.items;
      update();
      const named = [...culprits(ctx)];
      const key = ctx.ranks.map((r) => [r.attempt, r.rank, r.node, r.gpu, r.state].join(":")).join("|") + "#" + named.join(",");
      if (key === mapKey && !ctx.redraw.has("ranks")) return;
      ctx.redraw.delete("ranks");
      const placement = ctx.ranks.map((r) => [r.rank, r.node, r.gpu].join(":")).join("|");
      if (placement !== commKey) { await loadComm(ctx); commKey = placement; }
      await loadNodes(ctx.ranks.map((r) => r.node || ""));
      mapKey = key;
      window.MYPlacement.render(document.getElementById("placement-map"), ctx.ranks, nodes,
        { levels: ctx.levels, culprits: named, onSelect: select });
      const used = new Set(ctx.ranks.map((r) => r.node)).size;
      document.getElementById("placement-note").textContent = ctx.ranks.length
        ? `${ctx.ranks.length} ranks on ${used} node(s), attempt ${ctx.ranks[0].attempt}` : "";
    },
  });
})();
