// Goodput: the stacked bar of where the job's wall time went and the seconds per bucket,
// redrawn from GET /v1/jobs/{id}/goodput every poll (the page renders the first look).
"use strict";

(function () {
  const { el, svg, clear, api } = window.MY;
  const f1 = (x) => (Math.round(x * 10) / 10).toFixed(1);

  function draw(g) {
    const ratio = document.getElementById("goodput-ratio");
    clear(ratio);
    ratio.append(el("strong", {}, f1(g.ratio * 100) + "%"), ` productive of ${f1(g.wall_s)} s` +
      (g.steps_recomputed ? ` · ${g.steps_recomputed} steps recomputed` : ""));
    const some = g.wall_s > 0;
    document.getElementById("goodput-body").hidden = !some;
    document.getElementById("goodput-empty").hidden = some;
    if (!some) return;
    const bar = document.getElementById("goodput-bar");
    clear(bar);
    const t0 = g.segments.length ? g.segments[0].start : 0;
    for (const s of g.segments) {
      const rect = svg("rect", { class: "gp gp-" + s.kind, x: (1000 * (s.start - t0) / g.wall_s).toFixed(3),
        y: 0, width: (1000 * s.seconds / g.wall_s).toFixed(3), height: 18 });
      rect.appendChild(svg("title", {}, `${s.kind} (attempt ${s.attempt}): ${f1(s.seconds)} s`));
      bar.appendChild(rect);
    }
    bar.setAttribute("aria-label", "Wall time over time: " + Object.entries(g.seconds)
      .filter(([, v]) => v > 0).map(([k, v]) => `${k} ${f1(v)} s`).join(", "));
    const rows = document.getElementById("goodput-rows");
    clear(rows);
    for (const [k, v] of Object.entries(g.seconds)) {
      rows.appendChild(el("tr", { dataset: { bucket: k } },
        el("td", {}, el("span", { class: "gp-key gp-" + k, "aria-hidden": "true" }), " " + k),
        el("td", { class: "num" }, f1(v)), el("td", { class: "num" }, f1(100 * v / g.wall_s) + "%")));
    }
  }

  window.MYJob.register({
    name: "goodput",
    async tick(ctx) { draw(await api(ctx.base + "/goodput")); },
  });
})();
