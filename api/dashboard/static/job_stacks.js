// "Stacks now" (the button, shown while workers run, is job.js's): asks the runtime for every
// rank's Python stacks (POST /v1/jobs/{id}/stacks), waits for the answer and shows the stacks
// grouped by the server: ranks in the same user frames are one group, training threads first.
// Each group leads with its innermost user frame; the frames that only start a rank (runpy,
// Ray, meshyard's runner: "wrapper") fold into one expandable line; nothing is cut. Where py-spy
// is installed, each rank's native stacks follow (grouped the same way, folded).
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
      const top = g.user_frame ? " · at " + where(g.user_frame) : "";
      const d = el("details", { class: "stack" + (g.training ? " training" : ""), dataset: { ranks: g.ranks.join(",") } },
        el("summary", {}, `${who} · ${g.threads.join(", ")}${top}`),
        g.frames && g.frames.length ? frameList(g.frames) : el("pre", { class: "stack-text", tabindex: "0" }, g.stack));
      if (g.training) d.open = true;
      box.appendChild(d);
    }
    if (!req.groups.length) box.appendChild(el("p", { class: "muted" }, "No stacks came back."));
    // py-spy's dumps, native frames included, where it is installed on the nodes
    for (const g of req.native || []) {
      const who = (g.ranks.length === 1 ? "rank " : g.ranks.length + " ranks: ") + g.ranks_text;
      box.appendChild(el("details", { class: "stack native", dataset: { ranks: g.ranks.join(",") } },
        el("summary", {}, `native stacks (py-spy) · ${who}`),
        el("pre", { class: "stack-text", tabindex: "0" }, g.text)));
    }
  }

  function base(path) { return path.split("/").pop(); }
  function where(f) { return `${base(f.file)}:${f.line} in ${f.func}()`; }

  // What a run of wrapper frames is, in a few words: "runpy, runner, ray".
  function wrapperNames(frames) {
    const names = frames.map((f) => /\/ray\//.test(f.file) ? "ray" : /\/workers\//.test(f.file)
      ? "worker" : base(f.file).replace(/^<frozen (.*)>$/, "$1").replace(/\.py$/, "").replace(/^_/, ""));
    return [...new Set(names)].join(", ");
  }

  function frameLine(f) {
    return el("div", { class: "frame " + f.kind },
      el("span", { class: "frame-where" }, `File "${f.file}", line ${f.line}, in ${f.func}`),
      f.code ? el("span", { class: "frame-code" }, f.code) : null);
  }

  // Outermost first, as Python prints a stack; each run of wrapper frames folded.
  function frameList(frames) {
    const out = el("div", { class: "frames", tabindex: "0", role: "group", "aria-label": "frames, outermost first" });
    for (let i = 0; i < frames.length;) {
      if (frames[i].kind !== "wrapper") { out.appendChild(frameLine(frames[i])); i += 1; continue; }
      let j = i;
      while (j < frames.length && frames[j].kind === "wrapper") j += 1;
      const run = frames.slice(i, j);
      out.appendChild(el("details", { class: "wrappers" },
        el("summary", {}, `${run.length} wrapper frame${run.length === 1 ? "" : "s"} (${wrapperNames(run)})`),
        ...run.map(frameLine)));
      i = j;
    }
    return out;
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
