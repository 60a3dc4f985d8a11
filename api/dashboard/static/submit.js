// Submit a job from the dashboard: paste a spec or load a file, POST it to /v1/jobs with the
// page's CSRF token, and show a refusal inline with each problem's field path.
"use strict";

(function () {
  const { el, clear, api } = window.MY;
  const form = document.getElementById("submit-form");
  if (!form) return; // a viewer's page has no form
  const text = document.getElementById("spec-text");
  const file = document.getElementById("spec-file");
  const asJson = document.getElementById("spec-json");
  const key = document.getElementById("submission-id");
  const btn = document.getElementById("submit-btn");
  const status = document.getElementById("submit-status");
  const box = document.getElementById("submit-errors");
  const detail = document.getElementById("submit-detail");
  const list = document.getElementById("submit-error-list");

  file.addEventListener("change", async () => {
    const f = file.files && file.files[0];
    if (!f) return;
    if (f.size > 1024 * 1024) { status.textContent = "that file is over 1 MiB, the server's limit"; return; }
    text.value = await f.text();
    asJson.checked = /\.json$/i.test(f.name);
    status.textContent = "loaded " + f.name;
  });

  function refused(err) {
    box.hidden = false;
    clear(list);
    const body = err.body || {};
    detail.textContent = body.detail || err.message;
    for (const e of body.errors || []) {
      list.appendChild(el("li", { dataset: { loc: e.loc } }, el("code", { class: "loc" }, e.loc), ": " + e.msg));
    }
    box.scrollIntoView({ block: "nearest" });
  }

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    box.hidden = true;
    btn.disabled = true;
    status.textContent = "submitting…";
    const headers = { "Content-Type": asJson.checked ? "application/json" : "application/yaml" };
    if (key.value.trim()) headers["Idempotency-Key"] = key.value.trim();
    try {
      const job = await api("/v1/jobs", { method: "POST", headers, body: text.value });
      status.textContent = (job.created ? "submitted " : "already submitted ") + job.id;
      window.location.assign("/jobs/" + encodeURIComponent(job.id));
    } catch (err) {
      status.textContent = "refused (HTTP " + (err.status || "?") + ")";
      refused(err);
    } finally {
      btn.disabled = false;
    }
  });
})();
