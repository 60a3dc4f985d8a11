// Placement map: the job's nodes grouped by NVLink domain or leaf switch; each GPU a cell
// coloured by TP group (no group colour is red: red is the culprit's ring), with its PP stage
// as a top stripe and its DP index as a label (plus its EP / CP coordinate when the job has
// those dims). A node whose GPUs are all NVSwitch-connected
// gets one bar; otherwise a GPU's NVLinks are drawn while it is hovered or focused, so a
// DGX-1's 16 links stay readable. Focus a cell and press Enter (or click) to select its rank.
"use strict";

window.MYPlacement = (function () {
  const { el, svg, clear } = window.MY;
  const CELL = 46, GAP = 5, PER_ROW = 8, TOP = 22, ARC = 20;
  const PP_COLOURS = ["#1f4e79", "#b35c00", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457", "#5d4037", "#455a64"];

  // Hues from amber (45) through green and blue to violet (295): none reads as "culprit".
  function tpColour(group) {
    return `hsl(${45 + (group * 137.508) % 250}, 55%, ${group % 2 ? 74 : 64}%)`;
  }

  function meshSizes(ranks) {
    const size = { pp: 1, dp_replicate: 1, dp_shard: 1, ep: 1, cp: 1, tp: 1 };
    for (const r of ranks) {
      for (const k of Object.keys(size)) {
        const v = r.coords && Number.isInteger(r.coords[k]) ? r.coords[k] : 0;
        size[k] = Math.max(size[k], v + 1);
      }
    }
    return size;
  }

  // Group key: a multi-node NVLink domain when the node has one, else the finest level.
  function groupOf(node, levels) {
    const labels = (node && node.labels) || {};
    if (labels.nvlink_domain) return "nvlink_domain " + labels.nvlink_domain;
    for (const level of levels) if (labels[level]) return level + " " + labels[level];
    return "cluster";
  }

  function nvlinkPairs(topology) {
    const links = (topology && topology.links) || [];
    return links.filter((l) => /^NV\d+$/.test(String(l.type))).map((l) => [l.a, l.b, l.type]);
  }

  function drawNode(name, nodeRanks, info, ctx) {
    const gpuCount = Math.max(info.gpus || 0, ...nodeRanks.map((r) => (r.gpu === null ? -1 : r.gpu) + 1));
    const cpuOnly = nodeRanks.every((r) => r.gpu === null);
    const slots = cpuOnly ? nodeRanks.length : Math.max(gpuCount, 1);
    const bySlot = new Map();
    nodeRanks.forEach((r, i) => bySlot.set(cpuOnly ? i : r.gpu, r));
    const cols = Math.min(PER_ROW, slots), rows = Math.ceil(slots / PER_ROW);
    const pairs = cpuOnly ? [] : nvlinkPairs(info.topology).filter(([a, b]) => a < slots && b < slots);
    const full = slots > 1 && pairs.length === slots * (slots - 1) / 2;
    const arcs = pairs.length > 0 && !full;
    const title = name + (cpuOnly ? " (CPU)" : "");
    const w = Math.max(cols * (CELL + GAP) + GAP, title.length * 7 + 2 * GAP);
    const h = TOP + (arcs ? ARC : 0) + rows * (CELL + 14 + GAP) + (full ? 16 : 0);
    const root = svg("svg", { viewBox: `0 0 ${w} ${h}`, width: w, height: h, class: "pm-node-svg" });
    root.appendChild(svg("text", { x: GAP, y: 14, class: "pm-node-name" }, title));
    const y0 = TOP + (arcs ? ARC : 0);
    const pos = (slot) => ({ x: GAP + (slot % PER_ROW) * (CELL + GAP), y: y0 + Math.floor(slot / PER_ROW) * (CELL + 14 + GAP) });
    const links = [];
    if (arcs) {
      for (const [a, b, type] of pairs) {
        const pa = pos(a), pb = pos(b);
        if (pa.y !== pb.y) continue; // arcs only along a row; a second row is rare (> 8 GPUs)
        const xa = pa.x + CELL / 2, xb = pb.x + CELL / 2, yTop = pa.y - 2;
        const lift = Math.min(ARC - 2, 6 + Math.abs(b - a) * 3);
        const path = svg("path", { d: `M${xa} ${yTop} Q${(xa + xb) / 2} ${yTop - lift * 2} ${xb} ${yTop}`,
          class: "pm-nvlink pm-arc", "data-pair": `${a}-${b}`, "data-a": a, "data-b": b });
        path.appendChild(svg("title", {}, `GPU ${a} ↔ GPU ${b}: ${type}`));
        root.appendChild(path);
        links.push({ a, b, type, path });
      }
    }
    for (let s = 0; s < slots; s++) {
      const [cell, labels] = drawCell(s, bySlot.get(s), pos(s), ctx, cpuOnly);
      const mine = links.filter((l) => l.a === s || l.b === s);
      if (mine.length) {
        const on = (v) => () => mine.forEach((l) => l.path.classList.toggle("on", v));
        cell.addEventListener("pointerenter", on(true));
        cell.addEventListener("pointerleave", on(false));
        cell.addEventListener("focus", on(true));
        cell.addEventListener("blur", on(false));
        const says = `NVLinks of GPU ${s}: ` +
          mine.map((l) => `GPU ${l.a === s ? l.b : l.a} (${l.type})`).join(", ");
        const title = cell.querySelector("title");
        if (title) title.textContent += " · " + says; else cell.appendChild(svg("title", {}, says));
      }
      root.appendChild(cell);
      root.appendChild(labels);
    }
    if (full) {
      const yb = h - 10;
      root.appendChild(svg("line", { x1: GAP, x2: w - GAP, y1: yb, y2: yb, class: "pm-nvlink pm-switch",
        "data-pair": "all" }));
      root.appendChild(svg("text", { x: w / 2, y: yb + 9, "text-anchor": "middle", class: "pm-switch-label" },
        `NVSwitch: all ${pairs.length} pairs ${pairs[0][2]}`));
    }
    return el("div", { class: "pm-node", "data-node": name }, root);
  }

  // A cell (the focusable button: rects and its name) and, drawn over it, its labels. The
  // labels are a sibling hidden from assistive technology: the cell's name says it in words.
  function drawCell(slot, rank, p, ctx, cpuOnly) {
    const g = svg("g", { class: "pm-gpu" + (rank ? "" : " idle"), "data-gpu": String(slot) });
    const labels = svg("g", { class: "pm-labels", "aria-hidden": "true" });
    if (!rank) {
      g.appendChild(svg("rect", { x: p.x, y: p.y, width: CELL, height: CELL, rx: 4, class: "pm-free" }));
      labels.appendChild(svg("text", { x: p.x + CELL / 2, y: p.y + CELL + 11, "text-anchor": "middle", class: "pm-sub" }, "g" + slot));
      return [g, labels];
    }
    const c = rank.coords || {};
    const tpGroup = Math.floor(rank.rank / ctx.size.tp);
    const dp = (c.dp_replicate || 0) * ctx.size.dp_shard + (c.dp_shard || 0);
    const culprit = ctx.culprits.has(rank.rank);
    g.setAttribute("class", "pm-gpu used" + (culprit ? " culprit" : ""));
    g.setAttribute("data-rank", String(rank.rank));
    g.setAttribute("data-tp-group", String(tpGroup));
    g.setAttribute("data-pp", String(c.pp || 0));
    g.setAttribute("data-dp", String(dp));
    g.setAttribute("tabindex", "0");
    g.setAttribute("role", "button");
    const coord = (ctx.size.pp > 1 ? "p" + (c.pp || 0) + " " : "") + "d" + dp +
      (ctx.size.ep > 1 ? " e" + (c.ep || 0) : "") + (ctx.size.cp > 1 ? " c" + (c.cp || 0) : "");
    const sub = culprit ? "CULPRIT" : (cpuOnly ? "cpu" : "g" + slot);
    g.setAttribute("aria-label", `rank ${rank.rank}` + (culprit ? " (culprit)" : "") +
      ` on ${rank.node || "?"}${cpuOnly ? "" : " GPU " + slot}`);
    if (culprit) labels.setAttribute("class", "pm-labels culprit");
    g.appendChild(svg("rect", { x: p.x, y: p.y, width: CELL, height: CELL, rx: 4, fill: tpColour(tpGroup), class: "pm-cell" }));
    g.appendChild(svg("rect", { x: p.x, y: p.y, width: CELL, height: 6, fill: PP_COLOURS[(c.pp || 0) % PP_COLOURS.length], class: "pm-pp" }));
    labels.appendChild(svg("text", { x: p.x + CELL / 2, y: p.y + 27, "text-anchor": "middle", class: "pm-rank" }, String(rank.rank)));
    labels.appendChild(svg("text", { x: p.x + CELL / 2, y: p.y + 40, "text-anchor": "middle", class: "pm-coord" }, coord));
    labels.appendChild(svg("text", { x: p.x + CELL / 2, y: p.y + CELL + 11, "text-anchor": "middle",
      class: culprit ? "pm-sub pm-culprit-label" : "pm-sub" }, sub));
    if (culprit) {
      g.appendChild(svg("rect", { x: p.x - 2.5, y: p.y - 2.5, width: CELL + 5, height: CELL + 5, rx: 6, class: "pm-culprit-ring" }));
    }
    g.appendChild(svg("title", {}, `rank ${rank.rank} · pp ${c.pp || 0} · dp ${dp}` +
      (ctx.size.ep > 1 ? ` · ep ${c.ep || 0}` : "") + (ctx.size.cp > 1 ? ` · cp ${c.cp || 0}` : "") +
      ` · tp ${c.tp || 0}` +
      ` · TP group ${tpGroup} · ${rank.node || "?"}${cpuOnly ? "" : " GPU " + slot}` +
      (culprit ? " · CULPRIT" : "") + ` · ${rank.state}`));
    g.addEventListener("click", () => ctx.onSelect && ctx.onSelect(rank.rank));
    g.addEventListener("keydown", (e) => {
      if ((e.key === "Enter" || e.key === " ") && ctx.onSelect) { e.preventDefault(); ctx.onSelect(rank.rank); }
    });
    return [g, labels];
  }

  // ranks: /v1 rank items; nodes: name -> {labels, gpus, topology}; levels finest first.
  function render(container, ranks, nodes, opts) {
    const o = opts || {};
    clear(container);
    if (!ranks.length) {
      container.appendChild(el("p", { class: "muted" }, "No ranks placed yet."));
      return;
    }
    const ctx = { size: meshSizes(ranks), culprits: new Set(o.culprits || []), onSelect: o.onSelect };
    const byNode = new Map();
    for (const r of [...ranks].sort((a, b) => a.rank - b.rank)) {
      const key = r.node || "(unplaced)";
      if (!byNode.has(key)) byNode.set(key, []);
      byNode.get(key).push(r);
    }
    const groups = new Map();
    for (const [name, rs] of byNode) {
      const g = groupOf(nodes.get(name), o.levels || []);
      if (!groups.has(g)) groups.set(g, []);
      groups.get(g).push([name, rs]);
    }
    for (const [g, members] of groups) {
      const box = el("div", { class: "pm-group", "data-group": g }, el("h3", {}, g));
      const row = el("div", { class: "pm-nodes" });
      for (const [name, rs] of members) row.appendChild(drawNode(name, rs, nodes.get(name) || {}, ctx));
      box.appendChild(row);
      container.appendChild(box);
    }
  }

  return { render, tpColour, meshSizes };
})();
