// Jobs list: filters, keyset pagination (the API's cursor), live refresh every 2 s; the page
// shown sorted by a column; writers select unfinished jobs and cancel them together (two
// clicks, each cancel a POST with the page's CSRF token); a long status is one line, whole on
// hover or when expanded.
"use strict";

(function () {
  const { el, clear, api, ageSeconds, fmtAge, fmtNum, fmtTime, conditionText, stateBadge, poll, TERMINAL } = window.MY;
  const PAGE = 50;
  const ACTIVE = ["QUEUED", "PLACING", "STARTING", "RUNNING", "RESTARTING", "PREEMPTED", "CANCELLING"];
  const CONDITIONS = new Set(["hung", "straggling"]); // the state filter's open-diagnosis choices
  const body = document.getElementById("jobs-body");
  const empty = document.getElementById("jobs-empty");
  const fState = document.getElementById("f-state");
  const fOwner = document.getElementById("f-owner");
  const fName = document.getElementById("f-name");
  const prev = document.getElementById("prev");
  const next = document.getElementById("next");
  const label = document.getElementById("page-label");
  const canWrite = document.getElementById("jobs-table").dataset.canWrite === "1";
  const pickAll = document.getElementById("pick-all");
  const bulkBtn = document.getElementById("bulk-cancel");
  const bulkStatus = document.getElementById("bulk-status");
  const selected = new Set(); // ids of unfinished jobs ticked (kept across refreshes)
  const expanded = new Set(); // ids whose long status is shown whole
  let shown = []; // the page's jobs, as the API sent them
  let sortKey = "submitted", sortDir = -1;

  // cursors[i] is the cursor that loads page i (page 0: none). Newest first, so new jobs
  // appear on page 0 and older pages stay stable under the keyset cursor.
  let cursors = [null];
  let page = 0;
  let nextCursor = null;

  const params = new URLSearchParams(window.location.search);
  fState.value = params.get("state") || "";
  fOwner.value = params.get("owner") || "";
  fName.value = params.get("name") || "";

  function query() {
    const q = new URLSearchParams({ limit: String(PAGE) });
    const s = fState.value;
    if (s === "active") ACTIVE.forEach((a) => q.append("state", a));
    else if (CONDITIONS.has(s)) q.set("condition", s);
    else if (s) q.append("state", s);
    if (fOwner.value.trim()) q.set("owner", fOwner.value.trim());
    if (fName.value.trim()) q.set("name", fName.value.trim());
    if (cursors[page]) q.set("cursor", cursors[page]);
    return q;
  }

  // What the row says about the job now: its open condition (hung / straggling, naming the
  // culprit), else how a failed job ended or why a queued one waits; nothing while healthy.
  function statusCell(job) {
    const c = job.condition;
    if (c) {
      return el("td", { class: "status cond c-" + c.kind, "data-label": "Status" },
        el("span", { class: "cond-chip" }, c.kind), " ", conditionText(c).replace(/^\S+ /, ""));
    }
    const say = job.state === "FAILED" ? job.message : job.state === "QUEUED" && job.pending_reason
      ? job.status : "";
    const td = el("td", { class: "status" + (job.state === "FAILED" ? " failed" : ""), "data-label": "Status" });
    if (!say || say.length <= 80) { td.textContent = say || ""; return td; }
    // One line with an ellipsis; the whole text on hover, or expanded by a click or Enter.
    const open = expanded.has(job.id);
    td.appendChild(el("button", { type: "button", class: "clip" + (open ? " open" : ""), title: say,
      "aria-expanded": open ? "true" : "false", dataset: { expand: job.id } }, say));
    return td;
  }

  function duration(job) {
    const end = TERMINAL.has(job.state) ? Date.parse(job.updated_at) : null;
    const start = Date.parse(job.created_at);
    return end === null ? ageSeconds(job.created_at) : Math.max(0, (end - start) / 1000);
  }

  const SORT = {
    name: (j) => j.name.toLowerCase(), owner: (j) => j.owner, state: (j) => j.state,
    progress: (j) => (j.total_steps ? (j.last_step || 0) / j.total_steps : 0),
    loss: (j) => (j.last_loss === null ? Infinity : j.last_loss), ranks: (j) => j.world_size,
    submitted: (j) => Date.parse(j.created_at), duration: duration,
    started: (j) => (j.started_at ? Date.parse(j.started_at) : -Infinity),
  };

  function sorted(jobs) {
    const key = SORT[sortKey];
    return jobs.slice().sort((a, b) => {
      const x = key(a), y = key(b);
      return (x < y ? -1 : x > y ? 1 : 0) * sortDir;
    });
  }

  function pickCell(job) {
    const done = TERMINAL.has(job.state) || job.state === "CANCELLING";
    return el("td", { class: "pick" }, el("input", { type: "checkbox", "aria-label": "select " + job.name,
      disabled: done, checked: !done && selected.has(job.id), dataset: { pick: job.id } }));
  }

  function row(job) {
    const total = job.total_steps || 0;
    const step = job.last_step === null ? 0 : job.last_step;
    const link = el("a", { href: "/jobs/" + encodeURIComponent(job.id), class: "job-link" }, job.name);
    return el("tr", { dataset: { jobId: job.id, state: job.state }, class: job.condition ? "has-cond" : "" },
      canWrite ? pickCell(job) : null,
      el("td", { class: "name" }, link, el("div", { class: "muted small mono" }, job.id)),
      el("td", { "data-label": "Owner" }, job.owner),
      el("td", { "data-label": "State" }, stateBadge(job.state)),
      statusCell(job),
      el("td", { class: "progress-cell", "data-label": "Progress" },
        el("progress", { max: String(Math.max(total, 1)), value: String(Math.min(step, total)), "aria-label": "progress" }),
        el("span", { class: "small" }, total ? step + " / " + total : String(step))),
      el("td", { class: "num", "data-label": "Loss" }, fmtNum(job.last_loss)),
      el("td", { class: "num", "data-label": "Ranks" }, String(job.world_size)),
      el("td", { class: "when", title: job.created_at, "data-label": "Submitted" }, fmtTime(job.created_at)),
      el("td", { class: "when started", title: job.started_at || "not started", "data-label": "Started" },
        job.started_at ? fmtTime(job.started_at) : "—"),
      el("td", { class: "num", "data-label": "Duration" }, fmtAge(duration(job))));
  }

  function render() {
    clear(body);
    sorted(shown).forEach((j) => body.appendChild(row(j)));
    for (const id of [...selected]) {
      const j = shown.find((x) => x.id === id);
      if (!j || TERMINAL.has(j.state) || j.state === "CANCELLING") selected.delete(id);
    }
    if (bulkBtn && !bulkBtn.classList.contains("armed")) {
      bulkBtn.disabled = selected.size === 0;
      bulkBtn.textContent = selected.size ? "Cancel " + selected.size + " selected" : "Cancel selected";
    }
    document.querySelectorAll("th[data-sort]").forEach((th) => th.setAttribute("aria-sort",
      th.dataset.sort === sortKey ? (sortDir > 0 ? "ascending" : "descending") : "none"));
  }

  async function load() {
    const data = await api("/v1/jobs?" + query().toString());
    shown = data.items;
    render();
    empty.hidden = data.items.length > 0;
    nextCursor = data.next_cursor;
    next.disabled = !nextCursor;
    prev.disabled = page === 0;
    label.textContent = "page " + (page + 1);
  }

  const poller = poll(load, 2000);

  function refilter() {
    cursors = [null];
    page = 0;
    const q = new URLSearchParams();
    if (fState.value) q.set("state", fState.value);
    if (fOwner.value.trim()) q.set("owner", fOwner.value.trim());
    if (fName.value.trim()) q.set("name", fName.value.trim());
    const qs = q.toString();
    history.replaceState(null, "", qs ? "/?" + qs : "/");
    poller.now();
  }

  let typing = null;
  function debounced() { clearTimeout(typing); typing = setTimeout(refilter, 300); }
  fState.addEventListener("change", refilter);
  fOwner.addEventListener("input", debounced);
  fName.addEventListener("input", debounced);
  document.getElementById("filters").addEventListener("submit", (e) => { e.preventDefault(); refilter(); });
  next.addEventListener("click", () => {
    if (!nextCursor) return;
    cursors[page + 1] = nextCursor;
    page += 1;
    poller.now();
  });
  document.querySelectorAll("th[data-sort] button.sort").forEach((b) => b.addEventListener("click", () => {
    const key = b.parentNode.dataset.sort;
    sortDir = key === sortKey ? -sortDir : (key === "submitted" || key === "started" || key === "duration" ? -1 : 1);
    sortKey = key;
    render();
  }));
  body.addEventListener("click", (e) => {
    const t = e.target.closest("[data-expand]");
    if (!t) return;
    const id = t.dataset.expand;
    if (expanded.has(id)) expanded.delete(id); else expanded.add(id);
    t.classList.toggle("open", expanded.has(id));
    t.setAttribute("aria-expanded", expanded.has(id) ? "true" : "false");
  });
  body.addEventListener("change", (e) => {
    const id = e.target.dataset && e.target.dataset.pick;
    if (!id) return;
    if (e.target.checked) selected.add(id); else selected.delete(id);
    render();
  });
  if (pickAll) pickAll.addEventListener("change", () => {
    for (const j of shown) {
      if (TERMINAL.has(j.state) || j.state === "CANCELLING") continue;
      if (pickAll.checked) selected.add(j.id); else selected.delete(j.id);
    }
    render();
  });
  let armed = null;
  if (bulkBtn) bulkBtn.addEventListener("click", async () => {
    if (!armed) { // the first click arms, the second (within 5 s) cancels
      bulkBtn.textContent = "Confirm: cancel " + selected.size + " jobs";
      bulkBtn.classList.add("armed");
      armed = setTimeout(() => { armed = null; bulkBtn.classList.remove("armed"); render(); }, 5000);
      return;
    }
    clearTimeout(armed); armed = null;
    bulkBtn.classList.remove("armed");
    const ids = [...selected];
    bulkBtn.disabled = true;
    bulkStatus.textContent = "cancelling " + ids.length + "…";
    const results = await Promise.allSettled(ids.map((id) =>
      api("/v1/jobs/" + encodeURIComponent(id) + "/cancel", { method: "POST" })));
    const failed = results.filter((r) => r.status === "rejected");
    ids.forEach((id) => selected.delete(id));
    if (pickAll) pickAll.checked = false;
    bulkStatus.textContent = "cancel requested for " + (ids.length - failed.length) + " of " + ids.length
      + (failed.length ? " (" + failed[0].reason.message + ")" : "");
    poller.now();
  });
  prev.addEventListener("click", () => {
    if (page === 0) return;
    page -= 1;
    poller.now();
  });
})();
