// Training charts: loss (optionally log scale), throughput, learning rate and gradient norm,
// and, shown only for jobs that report them, the gradient bytes on the wire and compression
// ratio (DDP) and the MoE load-balancing loss, against the step or the wall clock. Every rank reports the all-reduced loss and the job's
// tokens/s, so rank 0's series is the job's: one row per step keeps a 512-rank job's charts
// as cheap as a 2-rank job's.
"use strict";

(function () {
  const { api, fmtBytes } = window.MY;
  // Charts drawn only when some step reports their metric: [figure, chart, key, options].
  const OPTIONAL = [
    ["fig-comm", "chart-comm", "comm", { cls: "grad", zeroBased: true, fmt: fmtBytes }],
    ["fig-ratio", "chart-ratio", "ratio", { cls: "tput", zeroBased: true, fmt: (v) => v.toFixed(2) + "x" }],
    ["fig-aux", "chart-aux", "aux", { cls: "loss" }],
  ];
  const steps = new Map();
  let maxStep = -1;
  const xSel = document.getElementById("chart-x");
  const logBox = document.getElementById("chart-log");

  function draw() {
    const xKind = xSel.value;
    const order = [...steps.keys()].sort((a, b) => a - b);
    const series = (k) => order.filter((s) => steps.get(s)[k] !== null && steps.get(s)[k] !== undefined)
      .map((s) => ({ x: xKind === "time" ? steps.get(s).time : s, y: steps.get(s)[k] }));
    const line = window.MYCharts.line;
    line(document.getElementById("chart-loss"), series("loss"),
      { cls: "loss", xKind, logY: logBox.checked, empty: "no loss reported yet" });
    line(document.getElementById("chart-tput"), series("tput"),
      { cls: "tput", xKind, zeroBased: true, empty: "no throughput reported yet" });
    line(document.getElementById("chart-lr"), series("lr"),
      { cls: "lr", xKind, empty: "the loop reports no learning rate" });
    line(document.getElementById("chart-grad"), series("grad"),
      { cls: "grad", xKind, empty: "the loop reports no gradient norm" });
    for (const [fig, chart, key, opts] of OPTIONAL) {
      const data = series(key);
      document.getElementById(fig).hidden = !data.length;
      if (data.length) line(document.getElementById(chart), data, { ...opts, xKind });
    }
  }
  xSel.addEventListener("change", draw);
  logBox.addEventListener("change", draw);

  window.MYJob.register({
    name: "charts",
    async tick(ctx) {
      let added = 0;
      for (let page = 0; page < 5; page++) {
        const data = await api(ctx.base + "/metrics?rank=0&after_step=" + maxStep + "&limit=10000");
        for (const p of data.items) {
          steps.set(p.step, { loss: p.loss, tput: p.tokens_per_s, lr: p.lr, grad: p.grad_norm, time: p.time,
            comm: p.grad_comm_bytes, ratio: p.grad_compression_ratio, aux: p.moe_aux_loss });
          maxStep = Math.max(maxStep, p.step);
        }
        added += data.items.length;
        if (data.items.length < 10000) break;
      }
      if (added || !document.querySelector("#chart-loss svg")) draw();
    },
  });
})();
