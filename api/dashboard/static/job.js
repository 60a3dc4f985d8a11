// Job detail page: the header (state, condition, status, cancel), the diagnosis, and the poll
// loop that drives every live panel. Each panel is its own script (job_*.js) that calls
// MYJob.register({name, tick(ctx)}); ctx holds what the panels share (the job, its ranks,
// the culprits of the newest diagnosis, the latest utilisation per rank); `early: true`
// panels run before the others in each poll.
"use strict";

window.MYJob = (function () {
  const { api, fmtNum, fmtClock, fmtTime, fmtAge, ageSeconds, poll, TERMINAL } = window.MY;
  const root = document.getElementById("job-root");
  const jobId = root.dataset.jobId;
  const panels = [];
  const ctx = {
    jobId, base: "/v1/jobs/" + encodeURIComponent(jobId),
    levels: (root.dataset.levels || "").split(",").filter(Boolean),
    canWrite: root.dataset.canWrite === "1",
    job: null, terminal: false, ranks: [], culprits: new Set(), diagnosis: null,
    usage: new Map(), // rank -> latest utilisation sample
    redraw: new Set(), // panels to redraw out of turn (a diagnosis arrived)
  };
  let diagId = null, terminalPolls = 0;

  function show(node, on) { if (node) node.hidden = !on; }

  // ---- header -------------------------------------------------------------------------
  function renderJob(job) {
    ctx.job = job;
    ctx.terminal = TERMINAL.has(job.state);
    const badge = document.getElementById("job-state");
    badge.textContent = job.state;
    badge.className = "badge state-" + job.state.toLowerCase();
    const step = job.last_step === null ? 0 : job.last_step;
    document.getElementById("job-progress").textContent =
      job.total_steps ? step + " / " + job.total_steps : String(step);
    const bar = document.getElementById("job-progress-bar");
    bar.max = Math.max(job.total_steps, 1);
    bar.value = Math.min(step, job.total_steps);
    document.getElementById("job-loss").textContent = fmtNum(job.last_loss);
    document.getElementById("job-attempt").textContent = String(job.current_attempt);
    document.getElementById("job-submitted").textContent = fmtTime(job.created_at);
    document.getElementById("job-started").textContent = job.started_at ? fmtTime(job.started_at) : "not yet";
    // From submission to the end (a finished job's last change), or to now.
    const since = (iso) => ctx.terminal ? Math.max(0, (Date.parse(job.updated_at) - Date.parse(iso)) / 1000) : ageSeconds(iso);
    document.getElementById("job-duration").textContent = fmtAge(since(job.created_at))
      + (job.started_at ? " (" + fmtAge(since(job.started_at)) + " since it started)" : "");
    show(document.getElementById("job-cancelled-by-fact"), !!job.cancelled_by);
    document.getElementById("job-cancelled-by").textContent = job.cancelled_by || "";
    const c = job.condition;
    // The banner says what the condition is; the status line where training stands.
    const status = c && c.kind === "hung" ? `no progress since step ${step} of ${job.total_steps}`
      : (c ? `training: step ${step} of ${job.total_steps}` : (job.status || job.message || "—"));
    document.getElementById("job-message").textContent = status;
    const banner = document.getElementById("condition");
    show(banner, !!c);
    if (c) {
      banner.className = "callout condition c-" + c.kind;
      document.getElementById("condition-kind").textContent = c.kind === "hung" ? "Hung" : "Straggling";
      document.getElementById("condition-text").textContent =
        "since " + fmtClock(c.since) + " — " + c.headline;
    }
    const pending = document.getElementById("pending");
    show(pending, job.state === "QUEUED" && !!job.pending_reason);
    if (!pending.hidden) document.getElementById("pending-text").textContent = pendingText(job.pending_reason);
    const cancel = document.getElementById("cancel-btn");
    if (cancel) {
      show(cancel, !ctx.terminal);
      cancel.disabled = job.state === "CANCELLING";
    }
    show(document.getElementById("stacks-btn"), job.state === "STARTING" || job.state === "RUNNING");
    // What the cancel button said ("cancel requested") is over once the job has ended.
    const said = document.getElementById("action-status");
    if (ctx.terminal && said.dataset.about === "cancel") { said.textContent = ""; delete said.dataset.about; }
  }

  // The pending reason's sentence; its numbers (needed / free GPUs) stay in the API.
  function pendingText(reason) {
    if (typeof reason !== "object" || reason === null) return String(reason);
    return reason.message || reason.detail || reason.kind || "waiting";
  }

  // ---- cancel (two clicks, no native dialog) -------------------------------------------
  const cancelBtn = document.getElementById("cancel-btn");
  const status = document.getElementById("action-status");
  let armed = null;
  if (cancelBtn) cancelBtn.addEventListener("click", async () => {
    if (!armed) {
      cancelBtn.textContent = "Confirm cancel";
      cancelBtn.classList.add("armed");
      armed = setTimeout(() => { armed = null; cancelBtn.textContent = "Cancel job"; cancelBtn.classList.remove("armed"); }, 5000);
      return;
    }
    clearTimeout(armed); armed = null;
    cancelBtn.textContent = "Cancel job"; cancelBtn.classList.remove("armed");
    cancelBtn.disabled = true;
    status.textContent = "cancelling…";
    try {
      const job = await api(ctx.base + "/cancel", { method: "POST" });
      status.textContent = "cancel requested (" + job.state + ")";
      status.dataset.about = "cancel";
      renderJob(job);
    } catch (err) {
      status.textContent = "cancel failed: " + err.message;
      cancelBtn.disabled = false;
    }
  });

  // ---- diagnosis ------------------------------------------------------------------------
  function showDiagnoses(data) {
    const latest = data.items.length ? Math.max(...data.items.map((d) => d.id)) : null;
    show(document.getElementById("jump-diagnosis"), latest !== null);
    if (latest === diagId) return;
    diagId = latest;
    ctx.diagnosis = data.items.find((d) => d.id === latest) || null;
    ctx.culprits = window.MYDiagnosis.render(jobId, data.items);
    ctx.redraw.add("ranks"); // outline the culprits on the map
  }

  // ---- loop -----------------------------------------------------------------------------
  async function tick() {
    // The job first, then its diagnoses, drawn together: a diagnosis is stored before the
    // state change it explains, so a page that shows FAILED also shows why.
    const job = await api(ctx.base);
    const diagnoses = await api(ctx.base + "/diagnoses");
    renderJob(job);
    showDiagnoses(diagnoses);
    // Panels marked `early` run first: what they put in ctx (utilisation) the others show.
    const results = [
      ...await Promise.allSettled(panels.filter((p) => p.early).map((p) => p.tick(ctx))),
      ...await Promise.allSettled(panels.filter((p) => !p.early).map((p) => p.tick(ctx)))];
    const failed = results.find((r) => r.status === "rejected");
    if (failed) throw failed.reason;
    if (ctx.terminal) terminalPolls += 1;
    return terminalPolls < 3; // a finished job gets two more looks, then polling stops
  }

  let poller = null;
  document.addEventListener("DOMContentLoaded", () => { poller = poll(tick, 2000); });

  return {
    ctx,
    register(panel) { panels.push(panel); },
    now() { if (poller) poller.now(); },
  };
})();
