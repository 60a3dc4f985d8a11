// Job detail page: polls the /v1 API every 2 s and updates header, charts, placement map,
// rank table, timeline, attempts, logs and the diagnosis in place.
"use strict";

(function () {
  const { el, clear, api, ageSeconds, fmtAge, fmtNum, fmtTime, stateBadge, poll, TERMINAL } = window.MY;
  const root = document.getElementById("job-root");
  const jobId = root.dataset.jobId;
  const levels = (root.dataset.levels || "").split(",").filter(Boolean);
  const base = "/v1/jobs/" + encodeURIComponent(jobId);
  const STALE_S = 30;

  const state = {
    job: null, lastEvent: 0, lastLog: 0, logRank: "", logLines: [],
    steps: new Map(), maxStep: -1,
    ranks: [], rankRows: new Map(), mapKey: "", culprits: new Set(), diagId: null,
    nodes: null, nodesKey: "", terminalPolls: 0, commKey: null,
  };

  // ---- header -------------------------------------------------------------------------
  function renderJob(job) {
    state.job = job;
    const badge = document.getElementById("job-state");
    badge.textContent = job.state;
    badge.className = "badge state-" + job.state.toLowerCase();
    const step = job.last_step === null ? 0 : job.last_step;
    document.getElementById("job-progress").textContent =
      job.total_steps ? step + " / " + job.total_steps : String(step);
    const bar = document.getElementById("job-progress-bar");
    bar.max = Math.max(job.total_steps, 1);
    bar.value = Math.min(step, job.total_steps);
    document.getElementById("job-loss").textContent = fmtNum(job.last_loss);
    document.getElementById("job-attempt").textContent = String(job.current_attempt);
    document.getElementById("job-message").textContent = job.message || job.failure_reason || "—";
    const pending = document.getElementById("pending");
    pending.hidden = !(job.state === "QUEUED" && job.pending_reason);
    if (!pending.hidden) document.getElementById("pending-text").textContent = pendingText(job.pending_reason);
    const btn = document.getElementById("cancel-btn");
    btn.disabled = TERMINAL.has(job.state) || job.state === "CANCELLING";
  }

  function pendingText(reason) {
    if (typeof reason !== "object" || reason === null) return String(reason);
    const main = reason.message || reason.detail || reason.reason || "";
    const rest = Object.entries(reason).filter(([k]) => !["message", "detail"].includes(k))
      .map(([k, v]) => k + ": " + (typeof v === "object" ? JSON.stringify(v) : v));
    return [main, rest.join(" · ")].filter(Boolean).join(" — ");
  }

  // ---- cancel (two clicks, no native dialog) -------------------------------------------
  const cancelBtn = document.getElementById("cancel-btn");
  const cancelStatus = document.getElementById("cancel-status");
  let armed = null;
  cancelBtn.addEventListener("click", async () => {
    if (!armed) {
      cancelBtn.textContent = "Confirm cancel";
      cancelBtn.classList.add("armed");
      armed = setTimeout(() => { armed = null; cancelBtn.textContent = "Cancel job"; cancelBtn.classList.remove("armed"); }, 5000);
      return;
    }
    clearTimeout(armed); armed = null;
    cancelBtn.textContent = "Cancel job"; cancelBtn.classList.remove("armed");
    cancelBtn.disabled = true;
    cancelStatus.textContent = "cancelling…";
    try {
      const job = await api(base + "/cancel", { method: "POST" });
      renderJob(job);
      cancelStatus.textContent = "cancel requested (" + job.state + ")";
    } catch (err) {
      cancelStatus.textContent = "cancel failed: " + err.message;
      cancelBtn.disabled = false;
    }
  });

  // ---- events, attempts ----------------------------------------------------------------
  async function loadEvents() {
    const data = await api(base + "/events?after=" + state.lastEvent + "&limit=1000");
    const list = document.getElementById("events");
    for (const e of data.items) {
      state.lastEvent = Math.max(state.lastEvent, e.id);
      const head = e.kind === "state" ? [e.src || "∅", " → ", stateBadge(e.dst)] : [el("span", { class: "kind k-" + e.kind }, e.kind)];
      list.appendChild(el("li", { class: "ev ev-" + e.kind },
        el("time", { datetime: e.at }, fmtTime(e.at)), " ", ...head,
        e.reason ? el("code", { class: "reason" }, e.reason) : null,
        e.message ? el("div", { class: "ev-msg" }, e.message) : null));
    }
  }

  async function loadAttempts() {
    const data = await api(base + "/attempts");
    const body = document.getElementById("attempts");
    clear(body);
    for (const a of data.items) {
      body.appendChild(el("tr", {}, el("td", { class: "num" }, String(a.number)), el("td", {}, a.state),
        el("td", {}, fmtTime(a.created_at)), el("td", {}, fmtTime(a.ended_at)),
        el("td", {}, [a.failure_reason, a.message].filter(Boolean).join(": ") || "—")));
    }
    if (!data.items.length) body.appendChild(el("tr", {}, el("td", { colspan: "5", class: "muted" }, "no attempt yet")));
  }

  // ---- metrics → charts ------------------------------------------------------------------
  // Every rank reports the all-reduced loss and the job's tokens/s, so rank 0's series is the
  // job's: one row per step keeps a 512-rank job's charts as cheap as a 2-rank job's.
  async function loadMetrics() {
    for (let page = 0; page < 5; page++) {
      const data = await api(base + "/metrics?rank=0&after_step=" + state.maxStep + "&limit=10000");
      for (const p of data.items) {
        state.steps.set(p.step, { loss: p.loss, tput: p.tokens_per_s });
        state.maxStep = Math.max(state.maxStep, p.step);
      }
      if (data.items.length < 10000) break;
    }
    const steps = [...state.steps.keys()].sort((a, b) => a - b);
    const series = (k) => steps.filter((s) => state.steps.get(s)[k] !== null).map((s) => ({ x: s, y: state.steps.get(s)[k] }));
    window.MYCharts.line(document.getElementById("chart-loss"), series("loss"), { cls: "loss", empty: "no loss reported yet" });
    window.MYCharts.line(document.getElementById("chart-tput"), series("tput"), { cls: "tput", zeroBased: true, empty: "no throughput reported yet" });
  }

  // ---- ranks: table + placement map ----------------------------------------------------
  const rankBody = document.getElementById("rank-body");
  const rankFilter = document.getElementById("rank-filter");
  const rankProblems = document.getElementById("rank-problems");

  function rankRow(r) {
    const cells = {};
    const tr = el("tr", { id: "rank-" + r.rank });
    for (const k of ["rank", "pp", "dp", "tp", "node", "gpu", "step", "phase", "hb", "state"]) {
      cells[k] = el("td", { class: ["rank", "pp", "dp", "tp", "gpu", "step"].includes(k) ? "num" : "" });
      tr.appendChild(cells[k]);
    }
    return { tr, cells };
  }

  function updateRanks() {
    const size = window.MYPlacement.meshSizes(state.ranks);
    const needle = rankFilter.value.trim().toLowerCase();
    let shown = 0;
    for (const r of state.ranks) {
      let row = state.rankRows.get(r.rank);
      if (!row) { row = rankRow(r); state.rankRows.set(r.rank, row); rankBody.appendChild(row.tr); }
      const c = r.coords || {};
      const age = ageSeconds(r.last_heartbeat);
      const stale = age !== null && age > STALE_S && !TERMINAL.has(state.job && state.job.state);
      const values = {
        rank: r.rank, pp: c.pp ?? "–", dp: (c.dp_replicate || 0) * size.dp_shard + (c.dp_shard || 0), tp: c.tp ?? "–",
        node: r.node || "–", gpu: r.gpu ?? "–", step: r.step ?? "–", phase: r.phase || "–",
        hb: fmtAge(age), state: r.state,
      };
      for (const [k, v] of Object.entries(values)) if (row.cells[k].textContent !== String(v)) row.cells[k].textContent = String(v);
      const culprit = state.culprits.has(r.rank);
      const bad = culprit || stale || /fail|dead|exit|error|lost/i.test(r.state);
      row.tr.className = [culprit ? "culprit" : "", stale ? "stale" : "", bad ? "bad" : ""].join(" ").trim();
      const text = [r.rank, r.node, r.state, r.phase, "gpu" + r.gpu].join(" ").toLowerCase();
      const visible = (!needle || text.includes(needle) || String(r.rank) === needle) && (!rankProblems.checked || bad);
      row.tr.hidden = !visible;
      if (visible) shown++;
    }
    document.getElementById("rank-count").textContent = shown + " of " + state.ranks.length + " ranks";
  }
  rankFilter.addEventListener("input", updateRanks);
  rankProblems.addEventListener("change", updateRanks);

  async function loadNodes(names) {
    const key = [...new Set(names)].sort().join(",");
    if (state.nodes && key === state.nodesKey) return;
    const [cluster, topo] = await Promise.all([api("/v1/cluster"), api("/v1/cluster/topology")]);
    const nodes = new Map();
    for (const n of cluster.nodes) nodes.set(n.name, { labels: n.labels, gpus: n.gpus, topology: {} });
    for (const t of topo.nodes) if (nodes.has(t.name)) nodes.get(t.name).topology = t.topology;
    state.nodes = nodes; state.nodesKey = key;
  }

  async function loadRanks() {
    const data = await api(base + "/ranks");
    if (state.ranks.length && data.items.length && data.items[0].attempt !== state.ranks[0].attempt) {
      clear(rankBody); state.rankRows.clear();
    }
    state.ranks = data.items;
    updateRanks();
    const mapKey = state.ranks.map((r) => [r.attempt, r.rank, r.node, r.gpu, r.state].join(":")).join("|") + "#" + [...state.culprits].join(",");
    if (mapKey !== state.mapKey) {
      const placement = state.ranks.map((r) => [r.rank, r.node, r.gpu].join(":")).join("|");
      if (placement !== state.commKey) { await loadComm(); state.commKey = placement; }
      await loadNodes(state.ranks.map((r) => r.node || ""));
      state.mapKey = mapKey;
      window.MYPlacement.render(document.getElementById("placement-map"), state.ranks, state.nodes, {
        levels, culprits: [...state.culprits],
        onSelect: (rank) => { rankFilter.value = String(rank); updateRanks(); document.getElementById("rank-" + rank).scrollIntoView({ block: "center" }); },
      });
      const nodesUsed = new Set(state.ranks.map((r) => r.node)).size;
      document.getElementById("placement-note").textContent = state.ranks.length
        ? `${state.ranks.length} ranks on ${nodesUsed} node(s), attempt ${state.ranks[0].attempt}` : "";
    }
  }

  // ---- communication signature (server-side cost model, redone when the ranks move) ------
  async function loadComm() {
    const data = await api("/jobs/" + encodeURIComponent(jobId) + "/comm.json");
    const note = document.getElementById("comm-note");
    const body = document.getElementById("comm-body");
    clear(body);
    if (!data.available) { note.textContent = "The cost model cannot read this job's spec."; return; }
    note.textContent = data.note;
    for (const r of data.rows) {
      body.appendChild(el("tr", {}, el("td", {}, r.dimension), el("td", { class: "num" }, String(r.participants)),
        el("td", {}, r.primitive), el("td", { class: "num" }, r.bytes_per_call),
        el("td", { class: "num" }, String(r.calls_per_step)), el("td", { class: "num" }, r.overlap),
        el("td", { class: "num" }, r.est_time), el("td", {}, r.bottleneck)));
    }
    if (!data.rows.length) body.appendChild(el("tr", {}, el("td", { colspan: "8", class: "muted" }, "No communication (one rank).")));
  }

  async function loadDiagnoses() {
    const data = await api(base + "/diagnoses");
    const latest = data.items.length ? Math.max(...data.items.map((d) => d.id)) : null;
    if (latest === state.diagId) return;
    state.diagId = latest;
    state.culprits = window.MYDiagnosis.render(jobId, data.items);
    state.mapKey = ""; // redraw the map with the culprits outlined
  }

  // ---- logs ------------------------------------------------------------------------------
  const logRank = document.getElementById("log-rank");
  const logTail = document.getElementById("log-tail");
  logRank.addEventListener("change", () => {
    state.logRank = logRank.value; state.lastLog = 0; state.logLines = [];
    logTail.textContent = "";
    poller.now();
  });

  function syncRankOptions() {
    if (logRank.options.length - 1 === state.ranks.length) return;
    while (logRank.options.length > 1) logRank.remove(1);
    for (const r of state.ranks) logRank.appendChild(el("option", { value: String(r.rank) }, "rank " + r.rank));
    logRank.value = state.logRank;
  }

  async function loadLogs() {
    syncRankOptions();
    const q = "?after=" + state.lastLog + "&limit=500" + (state.logRank !== "" ? "&rank=" + state.logRank : "");
    const data = await api(base + "/logs" + q);
    if (!data.items.length) { if (!state.logLines.length) logTail.textContent = "(no log lines yet)"; return; }
    for (const l of data.items) {
      state.lastLog = Math.max(state.lastLog, l.id);
      state.logLines.push((l.rank === null ? "[ctl]" : "[" + l.rank + "]") + (l.stream === "stderr" ? "! " : " ") + l.line);
    }
    state.logLines = state.logLines.slice(-500);
    const atBottom = logTail.scrollTop + logTail.clientHeight >= logTail.scrollHeight - 4;
    logTail.textContent = state.logLines.join("\n");
    if (atBottom) logTail.scrollTop = logTail.scrollHeight;
  }

  // ---- loop ------------------------------------------------------------------------------
  async function tick() {
    const job = await api(base);
    renderJob(job);
    await loadDiagnoses();
    await Promise.all([loadEvents(), loadAttempts(), loadMetrics(), loadRanks(), loadLogs()]);
    if (TERMINAL.has(job.state)) state.terminalPolls += 1;
    return state.terminalPolls < 3; // a finished job gets two more looks, then polling stops
  }
  const poller = poll(tick, 2000);
})();
