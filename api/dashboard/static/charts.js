// Line charts in SVG, drawn by hand: axes with "nice" ticks, one polyline, the last value.
"use strict";

window.MYCharts = (function () {
  const { svg, clear } = window.MY;
  const W = 560, H = 220, M = { l: 56, r: 14, t: 24, b: 30 };
  const MAX_POINTS = 800;

  function niceTicks(lo, hi, count) {
    if (!(hi > lo)) { hi = lo + 1; }
    const raw = (hi - lo) / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const ticks = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
    return ticks;
  }

  function label(v) {
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e3) return (v / 1e3).toFixed(a >= 1e4 ? 0 : 1) + "k";
    if (a > 0 && a < 0.01) return v.toExponential(0);
    return String(+v.toPrecision(3));
  }

  // Averages buckets of consecutive points so a 100k-step run still draws ~800 vertices.
  function downsample(points) {
    if (points.length <= MAX_POINTS) return points;
    const size = Math.ceil(points.length / MAX_POINTS);
    const out = [];
    for (let i = 0; i < points.length; i += size) {
      const chunk = points.slice(i, i + size);
      const y = chunk.reduce((s, p) => s + p.y, 0) / chunk.length;
      out.push({ x: chunk[chunk.length - 1].x, y });
    }
    return out;
  }

  // Trailing mean over ~1/30 of the run, drawn over the faint raw series.
  function smooth(points) {
    const k = Math.max(3, Math.round(points.length / 30));
    let sum = 0;
    return points.map((p, i) => {
      sum += p.y;
      if (i >= k) sum -= points[i - k].y;
      return { x: p.x, y: sum / Math.min(i + 1, k) };
    });
  }

  function line(container, points, opts) {
    const o = opts || {};
    clear(container);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart-svg", role: "presentation",
      "data-points": String(points.length) });
    container.appendChild(root);
    if (!points.length) {
      root.appendChild(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "chart-empty" },
        o.empty || "no data yet"));
      return root;
    }
    const pts = downsample(points);
    const xs = pts.map((p) => p.x), ys = pts.map((p) => p.y);
    let x0 = Math.min(...xs), x1 = Math.max(...xs);
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (x1 === x0) x1 = x0 + 1;
    const pad = (y1 - y0) * 0.08 || Math.abs(y1) * 0.1 || 1;
    y0 -= pad; y1 += pad;
    if (o.zeroBased && y0 > 0) y0 = 0;
    const sx = (x) => M.l + (x - x0) / (x1 - x0) * (W - M.l - M.r);
    const sy = (y) => H - M.b - (y - y0) / (y1 - y0) * (H - M.t - M.b);

    const grid = svg("g", { class: "grid" });
    for (const t of niceTicks(y0, y1, 4)) {
      grid.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: sy(t), y2: sy(t) }));
      grid.appendChild(svg("text", { x: M.l - 6, y: sy(t) + 4, "text-anchor": "end" }, label(t)));
    }
    for (const t of niceTicks(x0, x1, 5)) {
      if (t < x0 || t > x1) continue;
      grid.appendChild(svg("text", { x: sx(t), y: H - M.b + 16, "text-anchor": "middle" }, label(t)));
    }
    grid.appendChild(svg("text", { x: W - M.r, y: H - 2, "text-anchor": "end", class: "axis-name" }, "step"));
    root.appendChild(grid);
    root.appendChild(svg("line", { x1: M.l, x2: M.l, y1: M.t, y2: H - M.b, class: "axis" }));
    root.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, class: "axis" }));

    const pathOf = (ps) => ps.map((p, i) => (i ? "L" : "M") + sx(p.x).toFixed(1) + " " + sy(p.y).toFixed(1)).join(" ");
    const noisy = pts.length > 30;
    root.appendChild(svg("path", { d: pathOf(pts), class: "series " + (o.cls || "") + (noisy ? " raw" : "") }));
    if (noisy) root.appendChild(svg("path", { d: pathOf(smooth(pts)), class: "series smooth " + (o.cls || "") }));
    const last = pts[pts.length - 1];
    const dot = svg("circle", { cx: sx(last.x), cy: sy(last.y), r: 3.5, class: "last " + (o.cls || "") });
    dot.appendChild(svg("title", {}, `step ${last.x}: ${label(last.y)}`));
    root.appendChild(dot);
    root.appendChild(svg("text", { x: W - M.r, y: 15, "text-anchor": "end", class: "last-label" },
      `last ${label(last.y)} at step ${last.x}`));
    return root;
  }

  return { line, niceTicks, downsample, smooth };
})();
