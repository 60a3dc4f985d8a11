// Logs: per attempt, filtered by rank, stream and text (all server-side), the newest 500
// lines first and older pages on request, followed live; one rank's whole log downloads as
// a file. Each line shows when it was logged; the searched text is highlighted; "First
// traceback" shows the lines from the first Python traceback of the attempt on.
"use strict";

(function () {
  const { el, clear, api } = window.MY;
  const TRACEBACK = "Traceback (most recent call last)";
  const PAGE = 500, KEEP = 5000;
  const attemptSel = document.getElementById("log-attempt");
  const rankSel = document.getElementById("log-rank");
  const streamSel = document.getElementById("log-stream");
  const search = document.getElementById("log-search");
  const older = document.getElementById("log-older");
  const download = document.getElementById("log-download");
  const pre = document.getElementById("log-tail");
  const count = document.getElementById("log-count");
  const jump = document.getElementById("log-traceback");
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

  const two = (n, w) => String(n).padStart(w || 2, "0");
  // "14:03:07.123" in the browser's time zone.
  function clock(iso) {
    const d = new Date(iso);
    return isNaN(d) ? "" : `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}.${two(d.getMilliseconds(), 3)}`;
  }

  // The line's text with every case-insensitive match of the search in <mark>.
  function marked(textValue, needle) {
    const span = el("span", { class: "log-text" });
    if (!needle) { span.textContent = textValue; return span; }
    const low = textValue.toLowerCase(), n = needle.toLowerCase();
    let at = 0;
    for (let i = low.indexOf(n); i !== -1; i = low.indexOf(n, at)) {
      if (i > at) span.appendChild(document.createTextNode(textValue.slice(at, i)));
      span.appendChild(el("mark", {}, textValue.slice(i, i + n.length)));
      at = i + n.length;
    }
    if (at < textValue.length) span.appendChild(document.createTextNode(textValue.slice(at)));
    return span;
  }

  function lineNode(l, needle) {
    const who = (l.rank === null ? "[ctl]" : "[" + l.rank + "]") + (l.stream === "stderr" ? "!" : "");
    return el("span", { class: "log-line" + (l.stream === "stderr" ? " err" : ""), dataset: { id: String(l.id) } },
      el("span", { class: "log-who" }, who), " ",
      el("time", { class: "log-ts", datetime: l.at, title: l.at }, clock(l.at)), " ", marked(l.line, needle));
  }

  // Appends lines to the box, one per text line (no newline after the last).
  function appendLines(items, needle) {
    const frag = document.createDocumentFragment();
    let first = !pre.querySelector(".log-line");
    for (const l of items) {
      if (!first) frag.appendChild(document.createTextNode("\n"));
      frag.appendChild(lineNode(l, needle));
      first = false;
    }
    pre.appendChild(frag);
  }

  function draw(keepBottom) {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    const needle = search.value.trim();
    clear(pre);
    if (!lines.length) pre.textContent = "(no log lines match)";
    appendLines(lines, needle);
    if (keepBottom && atBottom) pre.scrollTop = pre.scrollHeight;
    older.disabled = exhausted;
    count.textContent = lines.length + " line(s) shown" + (exhausted ? " (from the first)" : "")
      + (needle ? " · matches of \u201c" + needle + "\u201d highlighted" : "");
  }

  // Shows the attempt's lines (under the rank and stream chosen) from the first one that
  // starts a Python traceback; following continues from there.
  jump.addEventListener("click", async () => {
    if (!ctxRef) return;
    const g = gen;
    const q = new URLSearchParams({ q: TRACEBACK, limit: "1" });
    if (attemptSel.value) q.set("attempt", attemptSel.value);
    if (rankSel.value !== "") q.set("rank", rankSel.value);
    if (streamSel.value) q.set("stream", streamSel.value);
    const found = await api(ctxRef.base + "/logs?" + q.toString());
    if (g !== gen) return;
    if (!found.items.length) { count.textContent = "no traceback in these lines"; return; }
    const first = found.items[0].id;
    if (!lines.length || first < lines[0].id) {
      const data = await api(ctxRef.base + "/logs?" + query({ after: first - 1, limit: PAGE }));
      if (g !== gen) return;
      lines = data.items;
      oldest = lines.length ? lines[0].id : null;
      newest = lines.length ? lines[lines.length - 1].id : newest;
      exhausted = false;
      loaded = true;
      draw(false);
    }
    const node = pre.querySelector(`[data-id="${first}"]`);
    if (!node) return;
    pre.querySelectorAll(".log-line.target").forEach((n) => n.classList.remove("target"));
    node.classList.add("target");
    pre.scrollTop = node.offsetTop - pre.offsetTop;
    pre.focus();
  });

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
      const wasEmpty = !lines.length;
      lines.push(...data.items);
      newest = lines[lines.length - 1].id;
      if (lines.length > KEEP || wasEmpty) {
        if (lines.length > KEEP) { lines = lines.slice(-KEEP); oldest = lines[0].id; exhausted = false; }
        draw(true);
        return;
      }
      // New lines are appended to what is shown; the view stays at the bottom if it was.
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      const needle = search.value.trim();
      appendLines(data.items, needle);
      if (atBottom) pre.scrollTop = pre.scrollHeight;
      count.textContent = lines.length + " line(s) shown" + (exhausted ? " (from the first)" : "")
        + (needle ? " · matches of \u201c" + needle + "\u201d highlighted" : "");
    },
  });
})();
