// Jobs list: filters, keyset pagination (the API's cursor), live refresh every 2 s.
"use strict";

(function () {
  const { el, clear, api, ageSeconds, fmtAge, fmtNum, conditionText, stateBadge, poll } = window.MY;
  const PAGE = 50;
  const ACTIVE = ["QUEUED", "PLACING", "STARTING", "RUNNING", "RESTARTING", "CANCELLING"];
  const body = document.getElementById("jobs-body");
  const empty = document.getElementById("jobs-empty");
  const fState = document.getElementById("f-state");
  const fOwner = document.getElementById("f-owner");
  const fName = document.getElementById("f-name");
  const prev = document.getElementById("prev");
  const next = document.getElementById("next");
  const label = document.getElementById("page-label");

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
    return el("td", { class: "status" + (job.state === "FAILED" ? " failed" : ""), "data-label": "Status" }, say || "");
  }

  function row(job) {
    const total = job.total_steps || 0;
    const step = job.last_step === null ? 0 : job.last_step;
    const link = el("a", { href: "/jobs/" + encodeURIComponent(job.id), class: "job-link" }, job.name);
    return el("tr", { dataset: { jobId: job.id, state: job.state }, class: job.condition ? "has-cond" : "" },
      el("td", { class: "name" }, link, el("div", { class: "muted small mono" }, job.id)),
      el("td", { "data-label": "Owner" }, job.owner),
      el("td", { "data-label": "State" }, stateBadge(job.state)),
      statusCell(job),
      el("td", { class: "progress-cell", "data-label": "Progress" },
        el("progress", { max: String(Math.max(total, 1)), value: String(Math.min(step, total)), "aria-label": "progress" }),
        el("span", { class: "small" }, total ? step + " / " + total : String(step))),
      el("td", { class: "num", "data-label": "Loss" }, fmtNum(job.last_loss)),
      el("td", { class: "num", "data-label": "Ranks" }, String(job.world_size)),
      el("td", { title: job.created_at, "data-label": "Age" }, fmtAge(ageSeconds(job.created_at))));
  }

  async function load() {
    const data = await api("/v1/jobs?" + query().toString());
    clear(body);
    data.items.forEach((j) => body.appendChild(row(j)));
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
  prev.addEventListener("click", () => {
    if (page === 0) return;
    page -= 1;
    poller.now();
  });
})();
