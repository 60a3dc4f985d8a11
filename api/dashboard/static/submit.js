// Submit a job from the dashboard: paste a spec or load a file, POST it to /v1/jobs with the
// page's CSRF token, and show a refusal inline with each problem's field path. A script job's
// code (a chosen folder, or files) is zipped here (stored entries, fixed times, name order:
// the same files give the same package), uploaded to POST /v1/packages, and named as the
// spec's entrypoint.working_dir (POST /v1/jobs?working_dir=package:sha256:...).
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
  const codeDir = document.getElementById("code-dir");
  const codeFiles = document.getElementById("code-files");
  const codeSummary = document.getElementById("code-summary");
  // Left out of a package, as `meshyard submit --working-dir` leaves them out.
  const SKIP_DIRS = new Set([".git", "__pycache__", ".venv", "venv", ".meshyard", ".mypy_cache",
    ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints"]);

  // [name in the zip, File]: a folder's files relative to the folder, or the files by name.
  function codeEntries() {
    const out = new Map();
    for (const f of codeDir.files || []) {
      const parts = (f.webkitRelativePath || f.name).split("/").slice(1);
      if (!parts.length || parts.some((p) => SKIP_DIRS.has(p)) || /\.pyc$/.test(f.name)) continue;
      out.set(parts.join("/"), f);
    }
    for (const f of codeFiles.files || []) out.set(f.name, f);
    return [...out.entries()].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  }

  function showCode() {
    const entries = codeEntries();
    const bytes = entries.reduce((n, [, f]) => n + f.size, 0);
    codeSummary.textContent = entries.length ? `${entries.length} file(s), ${bytes} bytes: ` +
      entries.slice(0, 5).map(([n]) => n).join(", ") + (entries.length > 5 ? ", …" : "") : "";
  }
  codeDir.addEventListener("change", showCode);
  codeFiles.addEventListener("change", showCode);

  const CRC = new Uint32Array(256).map((_, n) => {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    return c >>> 0;
  });
  function crc32(bytes) {
    let c = 0xffffffff;
    for (let i = 0; i < bytes.length; i++) c = CRC[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
    return (c ^ 0xffffffff) >>> 0;
  }

  // A zip of stored (uncompressed) entries, UTF-8 names, times 1980-01-01 00:00.
  async function buildZip(entries) {
    const enc = new TextEncoder();
    const parts = [], central = [];
    let offset = 0;
    for (const [name, file] of entries) {
      const data = new Uint8Array(await file.arrayBuffer());
      const nameBytes = enc.encode(name);
      const crc = crc32(data);
      const local = new DataView(new ArrayBuffer(30));
      local.setUint32(0, 0x04034b50, true); local.setUint16(4, 20, true); local.setUint16(6, 0x0800, true);
      local.setUint16(8, 0, true); local.setUint16(10, 0, true); local.setUint16(12, 0x21, true);
      local.setUint32(14, crc, true); local.setUint32(18, data.length, true); local.setUint32(22, data.length, true);
      local.setUint16(26, nameBytes.length, true); local.setUint16(28, 0, true);
      const head = new DataView(new ArrayBuffer(46));
      head.setUint32(0, 0x02014b50, true); head.setUint16(4, 0x0314, true); head.setUint16(6, 20, true);
      head.setUint16(8, 0x0800, true); head.setUint16(10, 0, true); head.setUint16(12, 0, true);
      head.setUint16(14, 0x21, true); head.setUint32(16, crc, true); head.setUint32(20, data.length, true);
      head.setUint32(24, data.length, true); head.setUint16(28, nameBytes.length, true);
      head.setUint32(38, 0o100644 << 16, true); head.setUint32(42, offset, true);
      parts.push(local, nameBytes, data);
      central.push(head, nameBytes);
      offset += 30 + nameBytes.length + data.length;
    }
    const size = central.reduce((n, p) => n + p.byteLength, 0);
    const end = new DataView(new ArrayBuffer(22));
    end.setUint32(0, 0x06054b50, true); end.setUint16(8, entries.length, true);
    end.setUint16(10, entries.length, true); end.setUint32(12, size, true); end.setUint32(16, offset, true);
    return new Blob([...parts, ...central, end], { type: "application/zip" });
  }

  // /submit?from=<job id>: the form starts with that job's stored spec (clone / resubmit).
  // &resume_step=<step>: and it starts from that job's checkpoint of that step.
  const query = new URLSearchParams(window.location.search);
  const from = query.get("from");
  const resumeStep = query.get("resume_step");
  if (from && /^[A-Za-z0-9_-]{1,40}$/.test(from)) {
    api("/v1/jobs/" + encodeURIComponent(from)).then((job) => {
      const spec = job.spec;
      const resume = resumeStep !== null && /^\d{1,9}$/.test(resumeStep);
      if (resume) spec.checkpoint = { ...(spec.checkpoint || {}), resume_from: { job: job.id, step: Number(resumeStep) } };
      text.value = JSON.stringify(spec, null, 2);
      asJson.checked = true;
      const masked = JSON.stringify((job.spec.entrypoint || {}).env || {}).includes('"***"');
      status.textContent = "the spec of " + job.name + " (" + job.id + ")"
        + (resume ? ", starting from its checkpoint of step " + resumeStep : "")
        + (masked ? "; its entrypoint.env values are hidden (***): fill them in" : "");
    }).catch((err) => { status.textContent = "cannot load " + from + ": " + err.message; });
  }

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
      let path = "/v1/jobs";
      const entries = codeEntries();
      if (entries.length) {
        status.textContent = `zipping ${entries.length} file(s)…`;
        const zip = await buildZip(entries);
        status.textContent = `uploading the code (${zip.size} bytes)…`;
        const pkg = await api("/v1/packages", { method: "POST", headers: { "Content-Type": "application/zip" }, body: zip });
        path += "?working_dir=" + encodeURIComponent(pkg.package);
        status.textContent = "submitting with " + pkg.package.slice(0, 27) + "…";
      }
      const job = await api(path, { method: "POST", headers, body: text.value });
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
