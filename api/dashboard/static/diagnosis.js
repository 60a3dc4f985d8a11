// Diagnosis view: the newest DiagnosisReport of the job (orchestrator/watchdog/report.py),
// titled by its class (a crash is not a hang).
"use strict";

window.MYDiagnosis = (function () {
  const { el, clear, fmtTime } = window.MY;
  const TITLES = {
    NOT_JOINED: "Hang: a rank never joined the collective",
    RANK_EXITED: "Crash: a rank exited",
    COLLECTIVE_MISMATCH: "Hang: collective mismatch",
    P2P_MISMATCH: "Hang: unmatched send/recv",
    COMM_WEDGED: "Hang: communication wedged",
    NON_COLLECTIVE_HANG: "Hang outside collectives",
    STRAGGLER: "Straggler",
    UNKNOWN: "Stall: cause unknown",
  };

  function dash(v) { return v === null || v === undefined ? "–" : String(v); }

  // Pending only when something was enqueued and not completed (an idle group is "0 / –").
  function pending(p) {
    if (typeof p.pending === "boolean") return p.pending;
    const enq = p.last_enqueued || 0;
    return enq > 0 && enq > (p.last_completed || 0);
  }

  function where(loc) {
    if (!loc) return "";
    const parts = [];
    if (loc.node) parts.push(loc.node + (loc.gpu !== null && loc.gpu !== undefined ? " GPU " + loc.gpu : ""));
    for (const [k, v] of Object.entries(loc.mesh || {})) parts.push(k + " " + v);
    for (const [k, v] of Object.entries(loc.labels || {})) parts.push(k + "=" + v);
    return parts.join(", ");
  }

  // Groups by mesh dimension (the same name on every rank); the one that matters first:
  // pending here (peers wait), or the collective this rank never entered.
  function pgCell(pgs) {
    const cell = el("td", { class: "pgs" });
    const rank = (p) => (p.missing_op ? 0 : pending(p) ? 1 : (p.last_enqueued || 0) > 0 ? 2 : 3);
    for (const p of [...(pgs || [])].sort((a, b) => rank(a) - rank(b))) {
      const name = p.name || (p.pg === "0" ? "default" : "pg " + p.pg);
      const cls = p.missing_op ? "pg behind" : pending(p) ? "pg stuck" : (p.last_enqueued || 0) > 0 ? "pg" : "pg idle";
      const note = p.missing_op ? ` — never entered ${p.missing_op}` : (pending(p) && p.pending_op ? ` — waiting in ${p.pending_op}` : "");
      cell.appendChild(el("div", { class: cls, dataset: { pg: p.pg, dim: name } },
        `${name}: ${dash(p.last_enqueued)} / ${dash(p.last_completed)}${note}`));
    }
    return cell;
  }

  function evidenceRow(e, culprits) {
    const errs = [...(e.exit_info ? ["exit: " + e.exit_info] : []), ...(e.nccl_errors || [])];
    return el("tr", { class: culprits.has(e.rank) ? "culprit" : "", dataset: { rank: String(e.rank) } },
      el("td", { class: "num" }, String(e.rank)), el("td", {}, e.state), el("td", { class: "num" }, dash(e.step)),
      el("td", {}, where(e.location)), pgCell(e.pgs), el("td", { class: "mono small" }, e.top_of_stack || "—"),
      el("td", { class: "small" }, errs.join("; ") || "—"));
  }

  function stacks(report, culprits) {
    const box = el("div", {});
    const full = (report.details && report.details.stacks) || {};
    const ev = [...(report.evidence || [])].sort((a, b) =>
      (culprits.has(b.rank) - culprits.has(a.rank)) || a.rank - b.rank);
    for (const e of ev) {
      const text = full[String(e.rank)] || e.top_of_stack;
      if (!text && !e.exit_info) continue;
      const d = el("details", { class: culprits.has(e.rank) ? "stack culprit" : "stack" },
        el("summary", {}, `rank ${e.rank}` + (culprits.has(e.rank) ? " (culprit)" : "") + ` — ${e.state}`),
        el("pre", { tabindex: "0" }, [text, e.exit_info && "exit: " + e.exit_info].filter(Boolean).join("\n")));
      if (culprits.has(e.rank)) d.open = true;
      box.appendChild(d);
    }
    if (!box.firstChild) box.appendChild(el("p", { class: "muted" }, "No stacks were captured."));
    const raw = el("details", { class: "stack" }, el("summary", {}, "analysis details (raw)"),
      el("pre", { tabindex: "0" }, JSON.stringify(report.details || {}, null, 2)));
    box.appendChild(raw);
    return box;
  }

  // The longest directory prefix all paths share ("/a/b/" for /a/b/x and /a/b/c/y).
  function commonDir(paths) {
    if (paths.length < 2) return "";
    let prefix = paths[0];
    for (const p of paths) while (!p.startsWith(prefix)) prefix = prefix.slice(0, -1);
    return prefix.slice(0, prefix.lastIndexOf("/") + 1);
  }

  function render(jobId, items) {
    const section = document.getElementById("diagnosis");
    if (!items.length) { section.hidden = true; return new Set(); }
    // Newest = highest id, whichever order the API lists them in.
    const byAge = [...items].sort((a, b) => b.id - a.id);
    const latest = byAge[0];
    const r = latest.report || {};
    // A straggler is a warning, not a culprit: the job trains on, only slower. Its slow
    // ranks are listed in the warning colour, and nothing is outlined as a culprit.
    const warning = latest.verdict === "STRAGGLER";
    const named = new Set(latest.culprit_ranks || []);
    const culprits = warning ? new Set() : named;
    section.hidden = false;
    document.getElementById("diag-title").textContent = TITLES[latest.verdict] || "Diagnosis";
    section.className = "card diagnosis v-" + String(latest.verdict).toLowerCase();
    const verdict = document.getElementById("diag-verdict");
    verdict.textContent = latest.verdict;
    verdict.className = "badge verdict v-" + String(latest.verdict).toLowerCase();
    document.getElementById("diag-meta").textContent =
      `attempt ${latest.attempt} · ${fmtTime(latest.created_at)}` +
      (r.confidence !== undefined ? ` · confidence ${Number(r.confidence).toFixed(2)}` : "");
    document.getElementById("diag-summary").textContent = latest.summary;
    document.getElementById("diag-culprits-label").textContent =
      warning ? "Slow ranks (a warning; the job keeps training)" : "Culprit ranks";
    const cul = document.getElementById("diag-culprits");
    clear(cul);
    if (!named.size) cul.textContent = "none identified";
    for (const c of named) {
      cul.appendChild(el("a", { href: "#rank-" + c, class: warning ? "culprit-chip warn-chip" : "culprit-chip" }, "rank " + c));
    }

    const hw = document.getElementById("diag-hardware");
    clear(hw);
    if ((r.suspect_hardware || []).length) {
      hw.appendChild(el("h3", {}, "Suspect hardware"));
      const ul = el("ul", {});
      for (const s of r.suspect_hardware) ul.appendChild(el("li", {}, `${s.level} ${s.name} (ranks ${(s.ranks || []).join(", ")}): ${s.reason}`));
      hw.appendChild(ul);
    }
    const recs = document.getElementById("diag-recs");
    clear(recs);
    for (const t of r.recommendations || []) recs.appendChild(el("li", {}, t));
    if (!recs.firstChild) recs.appendChild(el("li", { class: "muted" }, "none"));

    const mm = document.getElementById("diag-mismatches");
    clear(mm);
    for (const m of r.mismatches || []) {
      const dev = Object.entries(m.actual || {}).map(([k, v]) => `rank ${k}: ${v}`).join("; ");
      mm.appendChild(el("tr", {}, el("td", {}, m.pg), el("td", { class: "num" }, dash(m.seq)), el("td", {}, m.field),
        el("td", { class: "mono small" }, m.expected), el("td", { class: "mono small" }, dev)));
    }
    document.getElementById("diag-mismatch-block").hidden = !mm.firstChild; // shown when there are some

    const ev = document.getElementById("diag-evidence");
    clear(ev);
    for (const e of r.evidence || []) ev.appendChild(evidenceRow(e, culprits));
    const st = document.getElementById("diag-stacks");
    clear(st);
    st.appendChild(stacks(r, culprits));

    const arts = document.getElementById("diag-artifacts");
    clear(arts);
    const paths = r.artifacts || [];
    const dir = commonDir(paths);
    document.getElementById("diag-artifact-dir").textContent = dir ? "in " + dir : "";
    paths.forEach((path, i) => arts.appendChild(el("li", {},
      el("a", { href: `/jobs/${encodeURIComponent(jobId)}/artifacts/${latest.id}/${i}`, class: "mono", title: path },
        dir ? path.slice(dir.length) : path))));
    if (!arts.firstChild) arts.appendChild(el("li", { class: "muted" }, "none"));

    const older = document.getElementById("diag-older");
    clear(older);
    if (items.length > 1) {
      const d = el("details", {}, el("summary", {}, `${items.length - 1} earlier diagnosis(es)`));
      for (const it of byAge.slice(1)) {
        d.appendChild(el("p", {}, `attempt ${it.attempt} · ${it.verdict} · ranks ${(it.culprit_ranks || []).join(", ") || "–"}: ${it.summary}`));
      }
      older.appendChild(d);
    }
    return culprits;
  }

  return { render };
})();
