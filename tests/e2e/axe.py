"""axe-core in the page under test. The vendored script (tests/e2e/vendor) is evaluated
through the DevTools protocol, so the page's CSP, which allows only its own scripts, is not
relaxed for it; the dashboard never serves it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

AXE = Path(__file__).parent / "vendor" / "axe-4.14.1.min.js"
RUN = """async () => {
  const r = await axe.run(document, {resultTypes: ['violations']});
  return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 6).map(n => n.target.join(' ') + ' :: ' +
      (n.failureSummary || '').replace(/\\s+/g, ' ').slice(0, 240))}));
}"""


def axe_violations(page: Any) -> list[dict[str, Any]]:
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.evaluate(AXE.read_text())
    return list(page.evaluate(RUN))


def describe(violations: list[dict[str, Any]]) -> str:
    return "\n".join(f"{v['id']} ({v['impact']}): {v['help']}\n    " + "\n    ".join(v["nodes"])
                     for v in violations)
