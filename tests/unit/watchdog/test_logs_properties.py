"""Property tests for the log parser: any text is safe; launcher prefixes never change facts."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.watchdog.logs import parse_lines

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
LINES = [ln for p in sorted(FIXTURES.glob("*.log"))
         for ln in p.read_text().splitlines() if ln and not ln.startswith("#")]
PREFIXES = st.sampled_from([
    "", "[rank3]:", "[1,3]<stdout>:", "(RayTrainWorker pid=12, ip=10.0.0.2) ",
    "\x1b[36m(W pid=4)\x1b[0m ", "[36m(W pid=4) ", "2024-05-01 10:00:00.123 ",
    "[worker|3]:"])
VOLATILE = {"launcher_rank", "launcher_name", "actor", "actor_pid", "ip", "repeated", "line"}


def facts(lines: list[str]) -> list[dict]:
    return [{k: v for k, v in e.to_dict().items() if k not in VOLATILE and k != "rank"}
            for e in parse_lines(lines)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=20))
def test_arbitrary_text_never_raises(lines: list[str]) -> None:
    for e in parse_lines(lines):
        assert isinstance(e.to_dict()["kind"], str)


@settings(max_examples=150, deadline=None)
@given(line=st.sampled_from(LINES), prefix=PREFIXES, repeated=st.booleans())
def test_prefixes_and_ray_dedup_do_not_change_the_facts(line: str, prefix: str,
                                                        repeated: bool) -> None:
    decorated = prefix + line + (" [repeated 7x across cluster]" if repeated else "")
    assert facts([decorated]) == facts([line])
