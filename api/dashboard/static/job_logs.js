// Logs: per attempt, filtered by rank, stream and text (all server-side), the newest 500
// lines first and older pages on request, followed live; one rank's whole log downloads as
// a file.
"use strict";

(function () {
  const { el, api } = window.MY;
  const PAGE = 500, KEEP = 5000;
  const attemptSel = document.getElementById("log-attempt");
  const rankSel = document.getElementById("log-rank");
  const streamSel = document.getElementById("log-stream");
  const search = document.getElementById("log-search");
  const older = document.getElementById("log-older");
  const download = document.getElementById("log-download");
  const pre = document.getElementById("log-tail");
  const count = document.getElementById("log-count");
  let lines = [], newest = 0, oldest = null, exhausted = false, loaded = false, ctxRef = null;
  // A filter change starts a new generation; a response to an older one is dropped.
  let gen = 0;

  function query(extra) {
    const q = new URLSearchParams(extra);
    if (attemptSel.value) q.set("attempt", attemptSel.value);
    if (rankSel.value !== "") q.set("rank", rankSel.value);
    if (streamSel.value) q.set("stream", streamSel.value);
    if (search.value.trim()) q.set("q", search.value.trim());
    return q.toString();
  }

  function text(l) {
    return (l.rank === null ? "[ctl]" : "[" + l.rank + "]") + (l.stream === "stderr" ? "! " : " ") + l.line;
  }

  function draw(keepBottom) {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = lines.length ? lines.map(text).join("\n") : "(no log lines match)";
    if (keepBottom && atBottom) pre.scrollTop = pre.scrollHeight;
    older.disabled = exhausted;
    count.textContent = lines.length + " line(s) shown" + (exhausted ? " (from the first)" : "");
  }

  function reset() {
    gen += 1;
    lines = []; newest = 0; oldest = null; exhausted = false; loaded = false;
    const r = rankSel.value;
    download.hidden = r === "";
    if (r !== "" && ctxRef) {
      download.href = ctxRef.base + "/logs/download?" + query({ rank: r });
      download.textContent = "Download rank " + r + "'s log";
    }
    window.MYJob.now();
  }
  for (const s of [attemptSel, rankSel, streamSel]) s.addEventListener("change", reset);
  let typing = null;
  search.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(reset, 300); });
  document.getElementById("log-filters").addEventListener("submit", (e) => { e.preventDefault(); reset(); });

  older.addEventListener("click", async () => {
    if (oldest === null || !ctxRef) return;
    const g = gen;
    const data = await api(ctxRef.base + "/logs?" + query({ before: oldest, limit: PAGE }));
    if (g !== gen) return;
    if (data.items.length < PAGE) exhausted = true;
    if (data.items.length) { lines = [...data.items, ...lines]; oldest = data.items[0].id; }
    const keep = pre.scrollHeight - pre.scrollTop;
    draw(false);
    pre.scrollTop = pre.scrollHeight - keep; // stay on the line that was on screen
  });

  function syncOptions(ctx) {
    const n = ctx.job.current_attempt;
    if (attemptSel.options.length !== n) {
      const was = attemptSel.value;
      while (attemptSel.options.length) attemptSel.remove(0);
      for (let a = n; a >= 1; a--) attemptSel.appendChild(el("option", { value: String(a) }, "attempt " + a));
      if (!n) attemptSel.appendChild(el("option", { value: "" }, "—"));
      attemptSel.value = was && Number(was) <= n ? was : String(n || "");
    }
    if (rankSel.options.length - 1 !== ctx.job.world_size) {
      const was = rankSel.value;
      while (rankSel.options.length > 1) rankSel.remove(1);
      for (let r = 0; r < ctx.job.world_size; r++) rankSel.appendChild(el("option", { value: String(r) }, "rank " + r));
      rankSel.value = was;
    }
  }

  window.MYJob.register({
    name: "logs",
    async tick(ctx) {
      ctxRef = ctx;
      syncOptions(ctx);
      const g = gen;
      if (!loaded) {
        const data = await api(ctx.base + "/logs?" + query({ tail: PAGE }));
        if (g !== gen) return;
        lines = data.items;
        exhausted = data.items.length < PAGE;
        oldest = lines.length ? lines[0].id : null;
        newest = lines.length ? lines[lines.length - 1].id : 0;
        loaded = true;
        draw(true);
        pre.scrollTop = pre.scrollHeight;
        return;
      }
      const data = await api(ctx.base + "/logs?" + query({ after: newest, limit: 1000 }));
      if (g !== gen || !data.items.length) return;
      lines.push(...data.items);
      newest = lines[lines.length - 1].id;
      if (lines.length > KEEP) { lines = lines.slice(-KEEP); oldest = lines[0].id; exhausted = false; }
      draw(true);
    },
  });
})();
