// meshyard dashboard: shared helpers. Written by hand, no dependencies.
// Rule for every script here: data goes into the page through textContent / attributes
// only, never as markup, so a job named "<img src=x onerror=...>" stays text.
"use strict";

window.MY = (function () {
  const csrfMeta = document.querySelector('meta[name="csrf-token"]');
  const csrf = csrfMeta ? csrfMeta.getAttribute("content") : "";
  let clockSkewMs = 0; // server time minus browser time, from the Date header

  const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "dataset") Object.assign(node.dataset, v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.appendChild(typeof c === "string" || typeof c === "number"
        ? document.createTextNode(String(c)) : c);
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined) node.setAttribute(k, String(v));
    }
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  // A non-2xx answer; `body` is the decoded problem+json (its `errors` name field paths).
  class HttpError extends Error {
    constructor(status, detail, body) {
      super(detail || ("HTTP " + status));
      this.status = status;
      this.body = body || null;
    }
  }

  async function api(path, options) {
    const opts = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
    opts.headers = Object.assign({ Accept: "application/json" }, opts.headers);
    if (opts.method && opts.method !== "GET") opts.headers["X-CSRF-Token"] = csrf;
    const resp = await fetch(path, opts);
    const date = resp.headers.get("Date");
    if (date) clockSkewMs = Date.parse(date) - Date.now();
    if (resp.status === 401) {
      window.location.assign("/login");
      throw new HttpError(401, "signed out");
    }
    let body = null;
    try { body = await resp.json(); } catch (e) { body = null; }
    if (!resp.ok) throw new HttpError(resp.status, body && body.detail, body);
    return body;
  }

  function serverNow() { return Date.now() + clockSkewMs; }

  function ageSeconds(iso) {
    if (!iso) return null;
    return Math.max(0, (serverNow() - Date.parse(iso)) / 1000);
  }

  function fmtAge(seconds) {
    if (seconds === null || seconds === undefined || isNaN(seconds)) return "—";
    if (seconds < 60) return Math.floor(seconds) + "s";
    if (seconds < 3600) return Math.floor(seconds / 60) + "m";
    if (seconds < 86400) return Math.floor(seconds / 3600) + "h " + Math.floor(seconds % 3600 / 60) + "m";
    return Math.floor(seconds / 86400) + "d";
  }

  function fmtNum(v, digits) {
    if (v === null || v === undefined || isNaN(v)) return "—";
    const d = digits === undefined ? 4 : digits;
    if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(2) + "M";
    if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + "k";
    return Number(v).toFixed(d);
  }

  function fmtTime(iso) {
    if (!iso) return "—";
    const d = new Date(iso);
    return d.toLocaleString(undefined, { hour12: false });
  }

  // "06:56:21" in the browser's time zone, from an ISO string or unix seconds.
  function fmtClock(t) {
    if (t === null || t === undefined) return "—";
    const d = typeof t === "number" ? new Date(t * 1000) : new Date(t);
    return d.toLocaleTimeString(undefined, { hour12: false });
  }

  function fmtBytes(n) {
    if (n === null || n === undefined || isNaN(n)) return "—";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = Number(n), i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(Math.round(v)) : v.toFixed(v >= 100 ? 0 : 1)) + " " + units[i];
  }

  function fmtPercent(v) {
    return v === null || v === undefined || isNaN(v) ? "—" : Math.round(v) + "%";
  }

  // "hung since 06:56:21 — rank 1 never entered all_reduce #15", in local time.
  function conditionText(c) {
    return c ? c.kind + " since " + fmtClock(c.since) + " — " + c.headline : "";
  }

  function stateBadge(state) {
    return el("span", { class: "badge state-" + String(state).toLowerCase() }, String(state));
  }

  // Runs fn now and then every intervalMs (<= 2 s for live pages); pauses while the tab is
  // hidden, backs off after errors, and reports status in the #live element. One run at a
  // time: now() during a run asks for another as soon as it ends.
  function poll(fn, intervalMs) {
    const live = document.getElementById("live");
    let failures = 0;
    let timer = null;
    let running = false;
    let again = false;
    async function run() {
      if (document.hidden) return true;
      try {
        const more = await fn();
        failures = 0;
        if (live) { live.textContent = "live · " + new Date().toLocaleTimeString(undefined, { hour12: false }); live.className = "live ok"; }
        if (more === false) { if (live) live.textContent = "final"; return false; }
      } catch (err) {
        failures += 1;
        if (live) { live.textContent = "retrying: " + err.message; live.className = "live err"; }
      }
      return true;
    }
    async function tick() {
      timer = null;
      if (running) { again = true; return; }
      running = true;
      let more;
      try { more = await run(); } finally { running = false; }
      if (again) { again = false; tick(); return; }
      if (more) timer = setTimeout(tick, intervalMs * Math.min(8, 1 + failures));
    }
    tick();
    return { now: () => { if (timer) clearTimeout(timer); tick(); } };
  }

  return { el, svg, clear, api, HttpError, ageSeconds, fmtAge, fmtNum, fmtTime, fmtClock,
    fmtBytes, fmtPercent, conditionText, stateBadge, poll, serverNow, TERMINAL, csrf };
})();
