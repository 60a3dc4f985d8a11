// "Stacks now" (the button, shown while workers run, is job.js's): asks the runtime for every rank's Python stacks (POST /v1/jobs/{id}/stacks),
// waits for the answer and shows the stacks grouped: identical ones merged with their ranks,
// training threads first, as py-spy dump readers expect.
"use strict";

(function () {
  const { el, clear, api, fmtClock } = window.MY;
  const btn = document.getElementById("stacks-btn");
  const card = document.getElementById("stacks");
  const meta = document.getElementById("stacks-meta");
  const box = document.getElementById("stacks-groups");
  const status = document.getElementById("action-status");
  let shown = null, waiting = false, first = true;

  function render(req) {
    shown = req.id;
    card.hidden = false;
    document.getElementById("jump-stacks").hidden = false;
    clear(box);
    if (req.state !== "done") {
      meta.textContent = req.state === "failed" ? "failed: " + (req.error || "no answer")
        : "collecting from every rank…";
      return;
    }
    const missing = Object.keys(req.errors || {});
    meta.textContent = `taken ${fmtClock(req.finished_at)} from ${req.ranks_answered} rank(s)` +
      (missing.length ? ` · no answer from rank ${missing.join(", ")}` : "") +
      ` · ${req.groups.length} distinct stack(s)`;
    for (const g of req.groups) {
      const who = (g.ranks.length === 1 ? "rank " : g.ranks.length + " ranks: ") + g.ranks_text;
      const d = el("details", { class: "stack" + (g.training ? " training" : ""), dataset: { ranks: g.ranks.join(",") } },
        el("summary", {}, `${who} · ${g.threads.join(", ")}`),
        el("pre", { tabindex: "0" }, g.stack));
      if (g.training) d.open = true;
      box.appendChild(d);
    }
    if (!req.groups.length) box.appendChild(el("p", { class: "muted" }, "No stacks came back."));
  }

  async function follow(ctx, id) {
    waiting = true;
    try {
      const deadline = Date.now() + 75000;
      while (Date.now() < deadline) {
        const req = await api(ctx.base + "/stacks/" + id);
        render(req);
        if (req.state === "done" || req.state === "failed") return req;
        await new Promise((r) => setTimeout(r, 1000));
      }
      meta.textContent = "no answer yet; it is still being collected";
    } finally {
      waiting = false;
    }
    return null;
  }

  if (btn) btn.addEventListener("click", async () => {
    const ctx = window.MYJob.ctx;
    btn.disabled = true;
    status.textContent = "collecting stacks…";
    try {
      const req = await api(ctx.base + "/stacks", { method: "POST" });
      render(req);
      card.scrollIntoView({ block: "start" });
      const done = await follow(ctx, req.id);
      status.textContent = done ? "stacks " + done.state : "";
    } catch (err) {
      status.textContent = "stacks failed: " + err.message;
    } finally {
      btn.disabled = false;
    }
  });

  window.MYJob.register({
    name: "stacks",
    async tick(ctx) {
      if (!first || waiting) return;
      first = false; // the newest earlier request, once: later ones come from the button
      const data = await api(ctx.base + "/stacks");
      if (data.items.length && data.items[0].id !== shown) render(data.items[0]);
    },
  });
})();
