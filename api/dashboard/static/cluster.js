// Cluster page, live: every 2 s the node table's status, health (as cluster/_nodes.html's
// health_col draws it: a node Ray lost is "lost"), CPUs reserved, GPU strips and holders
// (GPUs and CPUs per job) follow /cluster.json; the utilisation columns (CPU, memory, GPU, a
// 30-minute CPU trend) follow /v1/cluster/usage. Cells are found by data-col, so columns
// without one stay as rendered. Admins cordon and uncordon a node from its health cell (two
// clicks; POST /v1/nodes/{name}/cordon or /uncordon with the page's CSRF token).
"use strict";

(function () {
  const { el, svg, clear, api, fmtBytes, fmtPercent, fmtClock, poll } = window.MY;
  const body = document.getElementById("nodes-body");
  const table = document.getElementById("nodes-table");
  const isAdmin = !!table && table.dataset.admin === "1";
  let armed = null; // {node, action, timer}: the cordon button clicked once
  let pollNow = () => {};
  const WINDOW_S = 1800;
  const samples = new Map(); // node -> [{at, cpu_percent, ...}]
  let since = Date.now() / 1000 - WINDOW_S;

  function cell(tr, col) { return tr.querySelector(`[data-col="${col}"]`); }

  function newRow(n) {
    // A node that joined since the page was rendered: the standard columns (reload for more).
    const tr = el("tr", { id: "node-" + n.name, dataset: { node: n.name } },
      el("td", {}, el("strong", {}, n.name)), el("td", { dataset: { col: "status" } }),
      el("td", { class: "health", dataset: { col: "health" } }),
      el("td", {}, ...Object.entries(n.labels).map(([k, v]) => el("span", { class: "tag" }, k + "=" + v))),
      el("td", { class: "num", dataset: { col: "cpus" } }), el("td", { dataset: { col: "gpus" } }),
      el("td", { dataset: { col: "holders" } }), el("td", { class: "num", dataset: { col: "cpu" } }),
      el("td", { class: "num", dataset: { col: "mem" } }), el("td", { dataset: { col: "gpu-util" } }),
      el("td", { class: "trend", dataset: { col: "trend" } }));
    body.appendChild(tr);
    return tr;
  }

  function drawHolders(td, n) {
    clear(td);
    if (!n.holders.length) { td.appendChild(el("span", { class: "muted" }, "—")); return; }
    for (const h of n.holders) {
      const who = h.job_id ? el("a", { href: "/jobs/" + encodeURIComponent(h.job_id) }, h.job_name) : h.job_name;
      const parts = [h.gpus ? "GPU " + h.gpus : "", h.cpus ? `${+h.cpus.toFixed(3)} CPU${h.cpus === 1 ? "" : "s"}` : ""].filter(Boolean);
      td.appendChild(el("div", { class: "small holder" }, who, ": " + parts.join(" · ") + (h.ranks ? ` · rank ${h.ranks}` : "")));
    }
  }

  function drawHealth(td, h, n) {
    clear(td);
    if (!n.alive) {
      td.appendChild(el("span", { class: "badge health-lost" }, "lost"));
      td.appendChild(el("div", { class: "small health-reason" }, "Ray lost this node; no job is placed on it"));
      return;
    }
    const state = h ? h.state : "healthy";
    td.appendChild(el("span", { class: "badge health-" + state }, state));
    if (isAdmin) td.append(" ", cordonButton(n.name, state === "cordoned" ? "uncordon" : "cordon"));
    if (!h) return;
    if (h.until) td.append(" ", el("span", { class: "small muted" }, h.until));
    if (h.gpus) td.appendChild(el("div", { class: "small" }, `GPU ${h.gpus} cordoned`));
    if (state !== "healthy" && h.reason) td.appendChild(el("div", { class: "small health-reason" }, h.reason));
    for (const [jobId, diag] of h.diagnoses) {
      td.append(el("a", { class: "small", href: "/jobs/" + encodeURIComponent(jobId) + "#diagnosis" },
        "diagnosis " + diag), " ");
    }
  }

  function cordonButton(node, action) {
    const on = armed && armed.node === node && armed.action === action;
    return el("button", { type: "button", class: "small cordon" + (on ? " armed" : ""),
      dataset: { node, action } }, on ? "Confirm " + action : action === "cordon" ? "Cordon" : "Uncordon");
  }

  if (body && isAdmin) body.addEventListener("click", async (e) => {
    const b = e.target.closest("button.cordon");
    if (!b) return;
    const { node, action } = b.dataset;
    if (!armed || armed.node !== node || armed.action !== action) {
      if (armed) clearTimeout(armed.timer);
      armed = { node, action, timer: setTimeout(() => { armed = null; pollNow(); }, 5000) };
      b.textContent = "Confirm " + action;
      b.classList.add("armed");
      return;
    }
    clearTimeout(armed.timer);
    armed = null;
    b.disabled = true;
    const status = document.getElementById("cordon-status");
    try {
      await api("/v1/nodes/" + encodeURIComponent(node) + "/" + action, { method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ reason: action + "ed from the dashboard" }) });
      status.textContent = node + ": " + action + "ed";
    } catch (err) {
      status.textContent = node + ": " + action + " failed: " + err.message;
    }
    pollNow();
  });

  function drawGpus(td, n) {
    clear(td);
    const strip = el("span", { class: "gpu-strip" });
    for (const g of n.gpus) {
      strip.appendChild(el("span", { class: "gpu-dot " + (g.job_id || g.hidden ? "used" : "free"),
        title: `GPU ${g.gpu}: ${g.job_name || "free"}` }));
    }
    td.appendChild(strip);
    td.appendChild(el("span", { class: "small" }, `${n.gpus.length - n.used} free / ${n.used} used`));
  }

  function trend(points) {
    const W = 120, H = 26;
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "spark", role: "img",
      "aria-label": "CPU use, last 30 minutes" });
    const now = Date.now() / 1000;
    const ps = points.filter((p) => p.cpu_percent !== null);
    if (ps.length > 1) {
      const d = ps.map((p, i) => (i ? "L" : "M") + ((1 - (now - p.at) / WINDOW_S) * W).toFixed(1) + " " +
        (H - 2 - Math.min(100, p.cpu_percent) / 100 * (H - 4)).toFixed(1)).join(" ");
      root.appendChild(svg("path", { d, class: "spark-line" }));
    }
    return root;
  }

  // One bar per GPU (its utilisation), the mean and the memory in use beside them.
  function gpuBars(gpus) {
    const W = 6, H = 22;
    const bars = svg("svg", { viewBox: `0 0 ${gpus.length * (W + 2)} ${H}`, width: gpus.length * (W + 2),
      height: H, class: "gpu-bars", role: "img", "aria-label": "utilisation per GPU" });
    gpus.forEach((g, i) => {
      const h = Math.max(1, Math.min(100, g.util || 0) / 100 * H);
      const bar = svg("rect", { x: i * (W + 2), y: H - h, width: W, height: h, class: "gpu-bar" });
      bar.appendChild(svg("title", {}, `GPU ${g.index}: ${fmtPercent(g.util)}, ${fmtBytes(g.mem_used_bytes)} of ${fmtBytes(g.mem_total_bytes)}`));
      bars.appendChild(bar);
    });
    const mean = gpus.reduce((s, g) => s + (g.util || 0), 0) / gpus.length;
    const used = gpus.reduce((s, g) => s + (g.mem_used_bytes || 0), 0);
    return el("div", { class: "gpu-util" }, bars,
      el("span", { class: "small" }, `mean ${fmtPercent(mean)} · ${fmtBytes(used)}`));
  }

  function drawUsage(tr, name) {
    const ps = samples.get(name) || [];
    const p = ps[ps.length - 1];
    cell(tr, "cpu").textContent = p ? fmtPercent(p.cpu_percent) : "—";
    cell(tr, "mem").textContent = p ? fmtBytes(p.mem_used_bytes) + " / " + fmtBytes(p.mem_total_bytes) : "—";
    const gpu = cell(tr, "gpu-util");
    clear(gpu);
    if (p && p.gpus.length) gpu.appendChild(gpuBars(p.gpus));
    else gpu.textContent = p ? "no NVML" : "—";
    const t = cell(tr, "trend");
    clear(t);
    t.appendChild(trend(ps));
  }

  let usageAt = 0;
  async function loadUsage() {
    const data = await api("/v1/cluster/usage?since=" + since.toFixed(3) + "&limit=20000");
    const cutoff = Date.now() / 1000 - WINDOW_S;
    for (const p of data.items) {
      if (!samples.has(p.node)) samples.set(p.node, []);
      samples.get(p.node).push(p);
      since = Math.max(since, p.at);
    }
    for (const [k, ps] of samples) samples.set(k, ps.filter((p) => p.at >= cutoff));
    const newest = data.items.length ? data.items[data.items.length - 1].at : null;
    if (newest) document.getElementById("usage-sampled").textContent = "utilisation sampled " + fmtClock(newest);
  }

  async function tick() {
    const now = await api("/cluster.json");
    document.getElementById("gpu-summary").textContent = now.summary;
    document.getElementById("no-nodes").hidden = now.nodes.length > 0;
    if (body && Date.now() - usageAt > 5000) { usageAt = Date.now(); await loadUsage(); }
    if (!body) return true;
    for (const n of now.nodes) {
      const tr = document.getElementById("node-" + n.name) || newRow(n);
      tr.className = n.alive ? "" : "dead";
      cell(tr, "status").textContent = n.alive ? "alive" : "lost";
      drawHealth(cell(tr, "health"), now.health[n.name], n);
      cell(tr, "cpus").textContent = `${+n.cpus_used.toFixed(3)} of ${n.cpus}`;
      drawGpus(cell(tr, "gpus"), n);
      drawHolders(cell(tr, "holders"), n);
      drawUsage(tr, n.name);
    }
    return true;
  }

  const poller = poll(tick, 2000);
  pollNow = () => poller.now();
})();
