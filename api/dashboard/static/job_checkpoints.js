// Checkpoints: every complete checkpoint rank 0 reported, with step, time, size, and whether
// `checkpoint.keep` has pruned it from disk since.
"use strict";

(function () {
  const { el, clear, api, fmtTime, fmtBytes } = window.MY;
  let key = null;

  window.MYJob.register({
    name: "checkpoints",
    async tick(ctx) {
      const data = await api(ctx.base + "/checkpoints");
      const next = data.items.map((c) => [c.attempt, c.step, c.removed].join(":")).join("|");
      if (next === key) return;
      key = next;
      const body = document.getElementById("ckpt-body");
      clear(body);
      for (const c of [...data.items].reverse()) {
        body.appendChild(el("tr", { class: c.removed ? "removed" : "", dataset: { step: String(c.step) } },
          el("td", { class: "num" }, String(c.step)), el("td", { class: "num" }, String(c.attempt)),
          el("td", {}, fmtTime(c.at)), el("td", { class: "num" }, fmtBytes(c.size_bytes)),
          el("td", {}, c.removed ? "pruned" : "kept"), el("td", { class: "mono small" }, c.path)));
      }
      if (!data.items.length) {
        const enabled = ctx.job.spec && ctx.job.spec.checkpoint && ctx.job.spec.checkpoint.enabled;
        body.appendChild(el("tr", {}, el("td", { colspan: "6", class: "muted" },
          enabled === false ? "checkpointing is off for this job" : "no checkpoint yet")));
      }
    },
  });
})();
