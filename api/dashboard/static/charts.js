// Line charts in SVG, drawn by hand at the container's own width (so text stays 11 px on a
// phone): "nice" ticks, an integer step axis or a wall-clock one, an optional log scale, one
// or more series, and a read-out of every series at the pointer's position. A point may carry
// `lo` and `hi` (a bucket of steps the server downsampled: its min and max), drawn as a band
// behind the line; `opts.onZoom(from, to)` makes a drag across a step-axis chart zoom.
"use strict";

window.MYCharts = (function () {
  const { el, svg, clear } = window.MY;
  const M = { l: 52, r: 12, t: 22, b: 28 };
  const MAX_POINTS = 800;
  const drawn = new Set(); // containers to redraw when the window is resized

  function niceStep(raw) {
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    return [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  }

  function niceTicks(lo, hi, count, opts) {
    if (!(hi > lo)) { hi = lo + 1; }
    let step = niceStep((hi - lo) / count);
    if (opts && opts.integer) step = Math.max(1, Math.round(step));
    const ticks = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
    return ticks;
  }

  // Wall-clock ticks: steps of 1 s ... 12 h that give about `count` ticks.
  const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200];
  function timeTicks(lo, hi, count) {
    const raw = (hi - lo) / count;
    const step = TIME_STEPS.find((s) => s >= raw) || 86400;
    const ticks = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) ticks.push(v);
    return { ticks, step };
  }

  // Ticks of a log axis (values are log10): powers of ten (and 2, 5 between them on a short
  // range); a range narrower than that gets linear ticks placed on the log axis.
  function logTicks(lo, hi) {
    const out = [];
    for (let e = Math.floor(lo); e <= Math.ceil(hi); e++) {
      for (const m of (hi - lo < 1.5 ? [1, 2, 5] : [1])) {
        const v = Math.log10(m) + e;
        if (v >= lo - 1e-9 && v <= hi + 1e-9) out.push(v);
      }
    }
    if (out.length >= 2) return out;
    return niceTicks(Math.pow(10, lo), Math.pow(10, hi), 4).filter((v) => v > 0).map(Math.log10);
  }

  function label(v) {
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e3) return (v / 1e3).toFixed(a >= 1e4 ? 0 : 1) + "k";
    if (a > 0 && a < 0.01) return v.toExponential(0);
    return String(+v.toPrecision(3));
  }

  // A tick's text with as many digits as the spacing of the ticks needs (3.0e-3, 3.1e-3).
  function tickLabel(v, step) {
    const a = Math.abs(v);
    if (!(step > 0) || a >= 1e3 || a === 0) return label(v);
    if (a < 0.01) return v.toExponential(Math.max(0, Math.min(4, Math.floor(Math.log10(a)) - Math.floor(Math.log10(step)))));
    return v.toFixed(Math.max(0, Math.min(6, -Math.floor(Math.log10(step)))));
  }

  function clock(t, step) {
    const d = new Date(t * 1000);
    const opts = step < 60 ? { hour: "2-digit", minute: "2-digit", second: "2-digit" }
      : { hour: "2-digit", minute: "2-digit" };
    return d.toLocaleTimeString(undefined, Object.assign({ hour12: false }, opts));
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

  function normalise(data) {
    if (!data.length || !Array.isArray(data[0].points)) return [{ name: "", points: data }];
    return data;
  }

  function nearest(points, x) {
    let lo = 0, hi = points.length - 1;
    while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (points[mid].x < x) lo = mid; else hi = mid; }
    return Math.abs(points[lo].x - x) <= Math.abs(points[hi].x - x) ? points[lo] : points[hi];
  }

  // data: an array of {x, y}, or of {name, points: [{x, y}]} for several series.
  // opts: cls, empty, zeroBased, logY, xKind ("step" | "time"), fmt (value -> text).
  function line(container, data, opts) {
    const o = opts || {};
    drawn.add(container);
    container.__chart = { data, opts: o };
    const hadFocus = container.contains(document.activeElement); // kept across a redraw
    clear(container);
    const width = Math.max(260, Math.min(900, container.clientWidth || 560));
    const W = width, H = width < 420 ? 190 : 220;
    const fmt = o.fmt || label;
    const all = normalise(data).map((s) => ({
      name: s.name, cls: s.cls,
      points: downsample(s.points.filter((p) => p.y !== null && p.y !== undefined && !isNaN(p.y)
        && (!o.logY || (p.y > 0 && !(p.lo <= 0))))),
    })).filter((s) => s.points.length);
    const count = all.reduce((n, s) => n + s.points.length, 0);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "chart-svg",
      role: "presentation", "data-points": String(count), "data-series": String(all.length),
      "data-scale": o.logY ? "log" : "linear", "data-x": o.xKind || "step" });
    container.appendChild(root);
    if (!count) {
      root.appendChild(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "chart-empty" },
        o.empty || "no data yet"));
      return root;
    }
    const ty = (y) => (o.logY ? Math.log10(y) : y);
    const xs = all.flatMap((s) => s.points.map((p) => p.x));
    const ys = all.flatMap((s) => s.points.flatMap((p) => (p.lo !== undefined
      ? [ty(p.y), ty(p.lo), ty(p.hi)] : [ty(p.y)])));
    let x0 = Math.min(...xs), x1 = Math.max(...xs);
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (x1 === x0) x1 = x0 + 1;
    const pad = (y1 - y0) * 0.08 || Math.abs(y1) * 0.1 || 1;
    y0 -= pad; y1 += pad;
    if (o.zeroBased && !o.logY && y0 > 0) y0 = 0;
    const sx = (x) => M.l + (x - x0) / (x1 - x0) * (W - M.l - M.r);
    const sy = (y) => H - M.b - (ty(y) - y0) / (y1 - y0) * (H - M.t - M.b);
    const syRaw = (v) => H - M.b - (v - y0) / (y1 - y0) * (H - M.t - M.b);

    const grid = svg("g", { class: "grid" });
    const yTicks = o.logY ? logTicks(y0, y1) : niceTicks(y0, y1, 4);
    const yStep = yTicks.length > 1 ? yTicks[1] - yTicks[0] : 0;
    for (const t of yTicks) {
      grid.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: syRaw(t), y2: syRaw(t) }));
      grid.appendChild(svg("text", { x: M.l - 6, y: syRaw(t) + 4, "text-anchor": "end", class: "y-tick" },
        o.logY ? label(Math.pow(10, t)) : o.fmt ? fmt(t) : tickLabel(t, yStep)));
    }
    const xTicks = o.xKind === "time" ? timeTicks(x0, x1, W < 420 ? 3 : 5)
      : { ticks: niceTicks(x0, x1, W < 420 ? 3 : 5, { integer: true }), step: 0 };
    for (const t of xTicks.ticks) {
      if (t < x0 || t > x1) continue;
      grid.appendChild(svg("text", { x: sx(t), y: H - M.b + 16, "text-anchor": "middle", class: "x-tick" },
        o.xKind === "time" ? clock(t, xTicks.step) : String(t)));
    }
    grid.appendChild(svg("text", { x: W - M.r, y: H - 2, "text-anchor": "end", class: "axis-name" },
      o.xKind === "time" ? "time" : "step"));
    root.appendChild(grid);
    root.appendChild(svg("line", { x1: M.l, x2: M.l, y1: M.t, y2: H - M.b, class: "axis" }));
    root.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, class: "axis" }));

    const pathOf = (ps) => ps.map((p, i) => (i ? "L" : "M") + sx(p.x).toFixed(1) + " " + sy(p.y).toFixed(1)).join(" ");
    let banded = 0;
    all.forEach((s, i) => {
      if (!s.points.some((p) => p.lo !== undefined && p.lo !== p.hi)) return;
      const edge = [...s.points.map((p) => ({ x: p.x, y: p.hi === undefined ? p.y : p.hi })),
        ...s.points.map((p) => ({ x: p.x, y: p.lo === undefined ? p.y : p.lo })).reverse()];
      root.appendChild(svg("path", { d: pathOf(edge) + " Z", class: "band " + (all.length > 1 ? "s" + (i % 8) : s.cls || o.cls || "") }));
      banded += 1;
    });
    root.dataset.banded = String(banded);
    all.forEach((s, i) => {
      const cls = "series " + (s.cls || o.cls || "") + (all.length > 1 ? " s" + (i % 8) : "");
      const noisy = all.length === 1 && s.points.length > 30 && !banded;
      root.appendChild(svg("path", { d: pathOf(s.points), class: cls + (noisy ? " raw" : "") }));
      if (noisy) root.appendChild(svg("path", { d: pathOf(smooth(s.points)), class: cls + " smooth" }));
    });
    const first = all[0], last = first.points[first.points.length - 1];
    if (all.length === 1) {
      root.appendChild(svg("circle", { cx: sx(last.x), cy: sy(last.y), r: 3.5, class: "last " + (o.cls || "") }));
    }
    const xText = (x) => (o.xKind === "time" ? clock(x, 1) : "step " + x);
    root.appendChild(svg("text", { x: W - M.r, y: 14, "text-anchor": "end", class: "last-label" },
      all.length === 1 ? `last ${fmt(last.y)} at ${xText(last.x)}` : `${all.length} series`));
    const fig = container.closest("figure");
    const caption = fig && fig.querySelector("figcaption");
    const name = o.name || container.getAttribute("aria-label") || (caption && caption.textContent.trim()) || "";
    readout(root, all, { sx, sy, W, H, x0, x1, fmt, xText, name, container, onZoom: o.xKind !== "time" ? o.onZoom : null });
    if (hadFocus) root.focus();
    return root;
  }

  // A crosshair and the value of every series at the pointer (mouse, pen or touch).
  function readout(root, all, g) {
    const cross = svg("line", { x1: M.l, x2: M.l, y1: M.t, y2: g.H - M.b, class: "cursor", visibility: "hidden" });
    const box = svg("g", { class: "readout", visibility: "hidden" });
    const bg = svg("rect", { rx: 3, class: "readout-bg" });
    const text = svg("text", { class: "readout-text" });
    box.appendChild(bg); box.appendChild(text);
    const dots = all.map((s, i) => svg("circle", { r: 3, visibility: "hidden",
      class: "dot " + (all.length > 1 ? "s" + (i % 8) : "") }));
    root.appendChild(cross); dots.forEach((d) => root.appendChild(d)); root.appendChild(box);
    const hit = svg("rect", { x: M.l, y: M.t, width: g.W - M.l - M.r, height: g.H - M.t - M.b, class: "hit" });
    root.appendChild(hit);
    function show(clientX) {
      const r = root.getBoundingClientRect();
      const px = (clientX - r.left) * (g.W / r.width);
      showAt(g.x0 + (px - M.l) / (g.W - M.l - M.r) * (g.x1 - g.x0));
    }
    function showAt(x) {
      const at = all.map((s) => nearest(s.points, x));
      const ref = at[0];
      cross.setAttribute("x1", g.sx(ref.x)); cross.setAttribute("x2", g.sx(ref.x));
      cross.setAttribute("visibility", "visible");
      at.forEach((p, i) => { dots[i].setAttribute("cx", g.sx(p.x)); dots[i].setAttribute("cy", g.sy(p.y)); dots[i].setAttribute("visibility", "visible"); });
      while (text.firstChild) text.removeChild(text.firstChild);
      const lines = [g.xText(ref.x), ...at.slice(0, 8).map((p, i) => (all[i].name ? all[i].name + ": " : "") + g.fmt(p.y)
        + (p.lo !== undefined && p.lo !== p.hi ? ` (${g.fmt(p.lo)}–${g.fmt(p.hi)}, ${p.n} steps)` : ""))];
      lines.forEach((t, i) => text.appendChild(svg("tspan", { x: 6, dy: i ? 13 : 12 }, t)));
      const w = Math.max(...lines.map((t) => t.length)) * 6.4 + 12, h = lines.length * 13 + 6;
      const bx = Math.min(Math.max(M.l, g.sx(ref.x) + 8), g.W - M.r - w);
      bg.setAttribute("width", w); bg.setAttribute("height", h);
      box.setAttribute("transform", `translate(${bx},${M.t})`);
      box.setAttribute("visibility", "visible");
      root.dataset.readout = lines.join(" | ");
      return lines;
    }
    // Keyboard: the chart takes focus; the arrow keys move the read-out point by point (with
    // Shift ten at a time), Home and End go to the first and the last, Escape hides it. What
    // it reads is announced through a polite live region.
    const spoken = el("span", { class: "sr-only", "aria-live": "polite" });
    root.after(spoken);
    const xs = all[0].points.map((p) => p.x);
    // The point read last, by its x, so a redraw with more points keeps it.
    const was = g.container.__readX;
    let at = was === undefined ? -1 : Math.max(0, xs.findIndex((x) => x >= was));
    function keyTo(i) {
      at = Math.max(0, Math.min(xs.length - 1, i));
      g.container.__readX = xs[at];
      spoken.textContent = showAt(xs[at]).join(", ");
    }
    root.setAttribute("tabindex", "0");
    root.setAttribute("role", "img");
    const name = g.name || "chart";
    root.setAttribute("aria-label", name + ": arrow keys read the values point by point");
    root.addEventListener("focus", () => keyTo(at < 0 ? xs.length - 1 : at));
    root.addEventListener("blur", () => hide());
    root.addEventListener("keydown", (e) => {
      const step = e.shiftKey ? 10 : 1;
      const moves = { ArrowRight: at + step, ArrowUp: at + step, ArrowLeft: at - step, ArrowDown: at - step,
        Home: 0, End: xs.length - 1 };
      if (e.key === "Escape") { hide(); return; }
      if (!(e.key in moves)) return;
      e.preventDefault();
      keyTo(moves[e.key]);
    });
    function hide() {
      [cross, box, ...dots].forEach((n) => n.setAttribute("visibility", "hidden"));
    }
    // Drag zoom: the steps under a drag of more than 6 px become the charts' range.
    const sel = svg("rect", { y: M.t, height: g.H - M.t - M.b, class: "zoom-sel", visibility: "hidden" });
    root.insertBefore(sel, hit);
    let dragFrom = null;
    const stepAt = (clientX) => {
      const r = root.getBoundingClientRect();
      const px = Math.min(Math.max((clientX - r.left) * (g.W / r.width), M.l), g.W - M.r);
      return { px, x: g.x0 + (px - M.l) / (g.W - M.l - M.r) * (g.x1 - g.x0) };
    };
    hit.addEventListener("pointermove", (e) => {
      show(e.clientX);
      if (dragFrom === null) return;
      const a = stepAt(e.clientX).px;
      sel.setAttribute("x", Math.min(a, dragFrom.px)); sel.setAttribute("width", Math.abs(a - dragFrom.px));
      sel.setAttribute("visibility", "visible");
    });
    hit.addEventListener("pointerdown", (e) => {
      show(e.clientX);
      if (g.onZoom && e.pointerType === "mouse") dragFrom = stepAt(e.clientX);
    });
    hit.addEventListener("pointerup", (e) => {
      if (dragFrom === null) return;
      const end = stepAt(e.clientX), start = dragFrom;
      dragFrom = null;
      sel.setAttribute("visibility", "hidden");
      if (Math.abs(end.px - start.px) > 6) {
        g.onZoom(Math.floor(Math.min(start.x, end.x)), Math.ceil(Math.max(start.x, end.x)));
      }
    });
    hit.addEventListener("pointerleave", () => { hide(); dragFrom = null; sel.setAttribute("visibility", "hidden"); });
  }

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      for (const c of drawn) if (c.isConnected && c.__chart) line(c, c.__chart.data, c.__chart.opts);
    }, 150);
  });

  return { line, niceTicks, downsample, smooth, label };
})();
