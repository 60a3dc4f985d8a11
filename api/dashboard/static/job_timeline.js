// Timeline: the job's events (state changes, diagnoses, errors) and its attempts.
"use strict";

(function () {
  const { el, clear, api, fmtTime, stateBadge } = window.MY;
  let lastEvent = 0;

  async function loadEvents(ctx) {
    const data = await api(ctx.base + "/events?after=" + lastEvent + "&limit=1000");
    const list = document.getElementById("events");
    for (const e of data.items) {
      lastEvent = Math.max(lastEvent, e.id);
      const head = e.kind === "state" ? [e.src || "∅", " → ", stateBadge(e.dst)] : [el("span", { class: "kind k-" + e.kind }, e.kind)];
      list.appendChild(el("li", { class: "ev ev-" + e.kind },
        el("time", { datetime: e.at }, fmtTime(e.at)), " ", ...head,
        e.reason ? el("code", { class: "reason" }, e.reason) : null,
        e.message ? el("div", { class: "ev-msg" }, e.message) : null));
    }
  }

  async function loadAttempts(ctx) {
    const data = await api(ctx.base + "/attempts");
    ctx.attempts = data.items;
    const body = document.getElementById("attempts");
    clear(body);
    for (const a of data.items) {
      body.appendChild(el("tr", {}, el("td", { class: "num" }, String(a.number)), el("td", {}, a.state),
        el("td", {}, fmtTime(a.created_at)), el("td", {}, fmtTime(a.ended_at)),
        el("td", {}, [a.failure_reason, a.message].filter(Boolean).join(": ") || "—")));
    }
    if (!data.items.length) body.appendChild(el("tr", {}, el("td", { colspan: "5", class: "muted" }, "no attempt yet")));
  }

  window.MYJob.register({
    name: "timeline",
    async tick(ctx) { await Promise.all([loadEvents(ctx), loadAttempts(ctx)]); },
  });
})();
