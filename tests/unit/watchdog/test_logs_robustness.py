"""The log parser on decorated, coloured, CRLF and cut copies of every fixture line.

- Any prefix (random text ending in a separator), ANSI colour codes anywhere (real ESC
  sequences and their ESC-less residue) and a CR at the end never lose an event of the plain
  line nor change its facts (ranks a prefix adds are its own business).
- Cut at every byte, a line never makes the parser raise, an event once present stays present
  as more of the line is read, and it is present as soon as its structure is: the table
  ANCHORS says, independently of the parser, what "intact" means for each kind.
- Linear cost: hostile lines 16 times longer take about 16 times as long, not 256 (a ratio
  measured in one run, with a wide margin; no absolute times).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.watchdog.logs import parse_lines

FIX = Path(__file__).resolve().parents[2] / "fixtures"
LINES = [ln for d in ("logs", "logs_realworld") for p in sorted((FIX / d).glob("*.log"))
         for ln in p.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
META = {"launcher_rank", "launcher_name", "actor", "actor_pid", "ip", "repeated", "line"}
EVENT_LINES = [ln for ln in LINES if parse_lines([ln])]

_HDR = r"\S+:\d+:\d+ \[\d+\] (?:\d+\.\d+ )?(?:\S+:\d+ )?NCCL "
ANCHORS: dict[str, str] = {
    "nccl_warn": _HDR + r"(?:WARN|ABORT|ERROR)",
    "nccl_coll": _HDR + r"INFO [A-Z][A-Za-z]+: opCount [0-9a-f]",
    "nccl_init": _HDR + r"INFO .*?comm 0x[0-9a-f]+ rank \d+ n[Rr]anks \d+(?:.*?cudaDev|.*?Init)",
    "nccl_ring": _HDR + r"INFO Channel \d+/\d+ :\s+\d",
    "nccl_channel": _HDR + r"INFO Channel \d+(?:/\d+)? : \d+\[[0-9a-fx]+\] -> \d+\[[0-9a-fx]+\]",
    "nccl_tree": _HDR + r"INFO Trees? \[\d+\] \S",
    "nccl_channels": _HDR + r"INFO \d+ coll channels, (?:\d+ nvls channels, )?\d+ p2p channels",
    "nccl_net": _HDR + r"INFO (?:NET/\w+ ?: Using .|Using network \w)",
    "nccl_bootstrap": _HDR + r"INFO Bootstrap ?: Using [\w.\-]+:[^<\s]",
    "nccl_retcode": _HDR + r"INFO [\w./\-]+:\d+ -> \d",
    "nccl_version": r"NCCL version \d+\.\d+\.\d",
    "torch_watchdog_timeout": r"Watchdog caught collective operation timeout",
    "torch_last_work": r"last enqueued (?:NCCL )?work: \d",
    "heartbeat_timeout": r"Heartbeat monitor timed out!",
    "heartbeat_stuck": r"watchdog got stuck for",
    "collective_mismatch": r"Detected mismatch between collectives on ranks|Received data size "
                           r"doesn't match expected size",
    "gloo_timeout": r"\] Timed out waiting",
    "monitored_barrier_failure": r"Rank \d+ failed to pass monitoredBarrier",
    "gloo_connection_closed": r"(?:Connection closed by peer|Read error|Connection reset by "
                              r"peer)",
    "desync_report": r"\[\d+\] Timeout at collective: \w+, #\d",
    "ras_mismatch": r"#\d+-\d+ \([0-9a-f]+\) MISMATCH",
    "fr_missing_ranks": r"Not all ranks joining collective(?: \d| ?,? sequence number: \d)",
    "rank_exited": r"ChildFailedError|^Failures:$|^Root Cause \(first observed failure\):$",
}


def facts(line: str) -> list[tuple[str, dict]]:
    return [(e.kind, {k: v for k, v in e.to_dict().items() if k not in META})
            for e in parse_lines([line])]


def kinds(line: str) -> set[str]:
    return {e.kind for e in parse_lines([line])}


def _comparable(f: dict, plain: dict) -> dict:
    """A prefix may add a rank the plain line did not have; it never changes one it had."""
    return {k: v for k, v in f.items() if not (k == "rank" and plain.get("rank") is None)}


SEPARATORS = st.sampled_from([" ", "\t", ": ", "] ", "> ", " | ", ") "])
PREFIX_TEXT = st.text(st.characters(blacklist_categories=["Cs", "Cc"]), max_size=60)
ANSI = st.sampled_from(["\x1b[36m", "\x1b[0m", "\x1b[1;31m", "\x1b[4m", "[36m", "[0m",
                        "\x1b(B", "\x1b[K"])


@st.composite
def decorated(draw: st.DrawFn) -> tuple[str, str]:
    line = draw(st.sampled_from(EVENT_LINES))
    prefix = draw(PREFIX_TEXT) + draw(SEPARATORS)
    out = list(prefix + line)
    for _ in range(draw(st.integers(0, 4))):
        out.insert(draw(st.integers(0, len(out))), draw(ANSI))
    return line, "".join(out) + ("\r" if draw(st.booleans()) else "")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(decorated())
def test_any_prefix_ansi_and_crlf_keep_every_event(case: tuple[str, str]) -> None:
    line, noisy = case
    plain = facts(line)
    got = facts(noisy)
    for kind, f in plain:
        assert any(k == kind and _comparable(g, f) == _comparable(f, f) for k, g in got), (
            kind, f, got)


def _intact_at(kind: str, line: str) -> int | None:
    m = re.search(ANCHORS[kind], line)
    return m.end() if m else None


@pytest.mark.parametrize("line", EVENT_LINES, ids=[ln[:40] for ln in EVENT_LINES])
def test_cut_at_every_byte(line: str) -> None:
    full = kinds(line)
    first: dict[str, int] = {}
    for t in range(len(line) + 1):
        seen = kinds(line[:t])
        for k in full:
            if k in seen:
                first.setdefault(k, t)
            else:
                assert k not in first, f"{k} present at {first[k]} lost at {t}"
    for k in full:
        intact = _intact_at(k, line)
        assert intact is not None, f"no anchor for {k} in {line!r}"
        assert first[k] <= intact, f"{k} appears at byte {first[k]}, intact at {intact}"


def test_cut_messages_say_they_are_partial() -> None:
    line = next(ln for ln in LINES if "Watchdog caught" in ln and "Timeout(ms)=" in ln)
    cut = line[: line.index("Timeout(ms)=")]
    (ev,) = parse_lines([cut])
    assert ev.get("partial") is True and ev.get("timeout_ms") is None
    assert parse_lines([line])[0].get("partial") is None


HOSTILE = ["a", ":1", "h:1:1 [0] ", "[PG 1(", " ", "Heartbeat monitor timed out!",
           "] Timed out waiting ", "[gloo", "TensorDtypes=a,", "last enqueued work: 1",
           "[rank0]:[E", "host:1:2 [0] NCCL INFO ", "2024-05-01T10:00:00Z ", "1: ",
           "(A pid=1, ", "[1;", "^[[", "SeqNum=1, ", ", but Rank ", "Read error",
           "Detected mismatch between collectives on ranks. Rank 1 is running collective: (",
           "Watchdog caught collective operation timeout: WorkNCCL(", "  traceback : x"]


def _best_of(line: str, n: int = 5) -> float:
    # CPU time of this process, best of n: preemption by other processes on a busy machine
    # does not count, so the ratio measures the parser's work rather than the machine's load.
    best = float("inf")
    for _ in range(n):
        t0 = time.process_time()
        parse_lines([line])
        best = min(best, time.process_time() - t0)
    return best


@pytest.mark.parametrize("unit", HOSTILE)
def test_cost_is_linear_on_long_hostile_lines(unit: str) -> None:
    n = 4000 // len(unit) + 1
    small, big = unit * n + "x", unit * n * 16 + "x"
    ratio = _best_of(big) / max(_best_of(small), 1e-6)
    assert ratio < 64, f"16x longer line cost {ratio:.0f}x (quadratic would be ~256x)"


def test_a_megabyte_line_parses() -> None:
    line = "node-a:1:2 [0] NCCL WARN " + "x" * 1_000_000
    (ev,) = parse_lines([line])
    assert ev.kind == "nccl_warn" and len(ev.get("message")) == 1_000_000


FILES = [p for d in ("logs", "logs_realworld") for p in sorted((FIX / d).rglob("*.log"))]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_whole_files_with_crlf_and_colour_parse_the_same(path: Path) -> None:
    from orchestrator.watchdog.logs import parse_text

    text = path.read_text()
    plain = [e.to_dict() for e in parse_text(text)]
    crlf = [e.to_dict() for e in parse_text(text.replace("\n", "\r\n"))]
    colour = [e.to_dict() for e in parse_text(
        "\n".join(f"\x1b[32m{ln[:1]}\x1b[0m{ln[1:]}" if ln else ln for ln in text.split("\n")))]
    assert crlf == plain
    assert colour == plain
