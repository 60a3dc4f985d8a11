// Checkpoints: every complete checkpoint rank 0 reported, with step, time, size, whether
// `checkpoint.keep` has pruned it from disk since, a kept one's files as a tar download, and
// "Resume from this": the submit form with this job's spec set to start from that checkpoint.
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
          el("td", {}, c.removed ? "pruned" : "kept"), el("td", { class: "mono small path" }, c.path),
          el("td", {}, c.removed ? "" : el("a", { href: `${ctx.base}/checkpoints/${c.attempt}/${c.step}/download`,
            download: "", class: "ckpt-download", "aria-label": `download the checkpoint of step ${c.step}` }, "Download"),
            c.removed ? "" : " · ",
            c.removed ? "" : el("a", { href: `/submit?from=${encodeURIComponent(ctx.jobId)}&resume_step=${c.step}`,
              class: "ckpt-resume", "aria-label": `a new job that resumes from the checkpoint of step ${c.step}` }, "Resume from this"))));
      }
      if (!data.items.length) {
        const enabled = ctx.job.spec && ctx.job.spec.checkpoint && ctx.job.spec.checkpoint.enabled;
        body.appendChild(el("tr", {}, el("td", { colspan: "7", class: "muted" },
          enabled === false ? "checkpointing is off for this job" : "no checkpoint yet")));
      }
    },
  });
})();
