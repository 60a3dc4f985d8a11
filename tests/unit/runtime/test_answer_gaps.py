"""A rank whose host answered no poll for seconds while its peers did, then answered again
(a link that dropped and came back): found by `AnswerGaps`, stored as a LINK_GAP warning on
the job; a gap every rank shares (the controller's own) is not."""

from __future__ import annotations

import doctest
from pathlib import Path

from orchestrator.runtime import answer_gaps
from orchestrator.runtime.answer_gaps import AnswerGaps
from orchestrator.runtime.events import LinkGap
from orchestrator.store import open_store
from tests.support.jobs import apply_controller_event, submit


def test_docstring_examples() -> None:
    assert doctest.testmod(answer_gaps).failed == 0


def _ticks(gaps: AnswerGaps, *, until: float, silent: dict[int, tuple[float, float]],
           ranks: int = 3, tick: float = 0.5) -> list[tuple[int, float]]:
    """Polls every `tick` s; rank r answers nothing within silent[r] = (from, to)."""
    out, t = [], 0.0
    while t <= until:
        for r in range(ranks):
            lo, hi = silent.get(r, (-1.0, -1.0))
            if lo <= t < hi:
                continue
            gap = gaps.answered(r, at=t + 0.01 * r)
            if gap is not None:
                out.append((r, gap))
        t += tick
    return out


def test_one_rank_silent_five_seconds_is_one_gap_of_about_five_seconds() -> None:
    assert _ticks(AnswerGaps(), until=20, silent={1: (6.0, 11.0)}) == [(1, 5.5)]


def test_short_silences_and_shared_silences_are_not_gaps() -> None:
    assert _ticks(AnswerGaps(), until=20, silent={1: (6.0, 9.0)}) == []  # 3.5 s < 4 s
    everyone = {r: (6.0, 14.0) for r in range(3)}  # the controller stopped polling
    assert _ticks(AnswerGaps(), until=20, silent=everyone) == []


def test_a_rank_that_never_answers_again_is_no_gap() -> None:
    assert _ticks(AnswerGaps(), until=20, silent={2: (4.0, 99.0)}) == []


def test_two_flaps_of_one_rank_are_two_gaps() -> None:
    got = _ticks(AnswerGaps(), until=40, silent={0: (5.0, 11.0), 2: (25.0, 30.0)})
    assert [(r, round(g)) for r, g in got] == [(0, 6), (2, 6)]


def _rounds(gaps: AnswerGaps, *, until: float, silent: dict[int, tuple[float, float]],
            ranks: int = 2, tick: float = 0.1) -> list[tuple[int, float]]:
    """As the controller's drain asks: one round of polls every `tick` s, every rank asked;
    rank r's poll fails at once (a broken connection, not a timeout) within silent[r]."""
    out, t = [], 0.0
    while t <= until:
        answered = {r: t for r in range(ranks)
                    if not silent.get(r, (-1.0, -1.0))[0] <= t < silent.get(r, (-1.0, -1.0))[1]}
        out += sorted(gaps.round(answered, asked=range(ranks)).items())
        t += tick
    return out


def test_a_rank_whose_polls_fail_fast_while_the_other_answers_every_tick_is_a_gap() -> None:
    """Short ticks: the peer's few kept answer times all fall after the silence's middle, so
    only the rounds the silent rank missed show it was its own silence, not the
    controller's."""
    got = _rounds(AnswerGaps(), until=20, silent={1: (6.0, 11.0)})
    assert [(r, round(g)) for r, g in got] == [(1, 5)]
    everyone = {0: (6.0, 11.0), 1: (6.0, 11.0)}  # no round answered: the controller's own
    assert _rounds(AnswerGaps(), until=20, silent=everyone) == []


def _blocking_ticks(gaps: AnswerGaps, *, down: tuple[float, float], until: float = 30,
                    timeout: float = 5.0) -> list[tuple[int, float]]:
    """As the controller polls: rank 0 then rank 1, each poll waiting up to `timeout`; rank
    1's host is cut off during `down`, so its poll blocks the tick until it times out."""
    out, t = [], 0.0
    while t <= until:
        gaps.answered(0, at=t)  # rank 0 answers every tick
        if down[0] <= t < down[1]:
            t += timeout  # the poll to rank 1 times out
            gaps.missed(1)
        else:
            gap = gaps.answered(1, at=t + 0.05)
            if gap is not None:
                out.append((1, gap))
        t += 0.5
    return out


def test_a_rank_whose_polls_time_out_while_its_peer_answers_is_a_gap() -> None:
    got = _blocking_ticks(AnswerGaps(), down=(6.0, 11.0))
    assert got == [(1, 6.0)]  # from its last answer (5.55) to its next (11.55)
    assert _blocking_ticks(AnswerGaps(), down=(6.0, 6.4), timeout=2.0) == []  # 2.6 s: short


def test_a_gap_is_stored_as_a_warning_naming_rank_host_and_seconds(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        job_id = submit(store, {"name": "flap"})
        apply_controller_event(store, job_id, LinkGap(
            rank=1, node="myl-h2", host="198.18.0.12", silent_s=5.4))
        (ev,) = [e for e in store.list_events(job_id) if e.reason == "LINK_GAP"]
        assert ev.kind == "warning"
        assert ev.message.startswith("rank 1 on myl-h2 (198.18.0.12) answered no poll for 5.4 s")
        assert "training went on" in ev.message
        assert ev.data == {"attempt": 1, "rank": 1, "node": "myl-h2", "host": "198.18.0.12",
                           "silent_s": 5.4}
    finally:
        store.close()


def test_silent_for_counts_only_while_a_peer_answers() -> None:
    g = AnswerGaps()
    for r in (0, 1, 2):
        g.answered(r, at=0.0)
    assert [g.silent_for(r, now=30.0) for r in (0, 1, 2)] == [0.0, 0.0, 0.0]  # all silent
    g.answered(0, at=12.0)
    g.answered(2, at=12.1)
    assert g.silent_for(1, now=20.0) == 20.0  # its peers answered at 12 s, it never since
    assert g.silent_for(0, now=20.0) == 0.0  # rank 2 answered after it, but rank 0 answers
    assert g.silent_for(7, now=20.0) == 0.0  # a rank never seen is not called cut off
    g.answered(1, at=21.0)
    assert g.silent_for(1, now=22.0) == 0.0
