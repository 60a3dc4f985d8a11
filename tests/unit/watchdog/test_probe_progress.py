"""Progress without a step counter (pure): collective counts from the probes drive the stall
rule, its adaptive threshold and the first-collective timeout; the probe's files; the local
watcher's command-line and exit helpers; the user's frame on a stack."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from api.cli.local_watch import _blame, _exits, launcher_env, world_size_of
from meshyard import _frames
from orchestrator.spec import Watchdog
from orchestrator.watchdog import probe_files
from orchestrator.watchdog.monitor import HangMonitor


def _mon(**watchdog: object) -> HangMonitor:
    return HangMonitor.from_spec(Watchdog(**watchdog), world_size=2, now_s=0.0)


def test_collective_counts_are_progress_when_no_step_is_reported() -> None:
    m = _mon(stall_timeout_s=3)
    assert m.progress == "step" and not m.has_progress()
    for t, n in ((1.0, 2), (1.5, 4), (2.0, 6)):
        m.observe(now_s=t, collectives={0: n, 1: n})
    assert m.progress == "collective" and m.has_progress()
    assert m.due(4.9) is None
    due = m.due(5.1)
    assert due is not None and due.trigger == "stall" and due.progress == "collective"
    assert due.describe().startswith("no rank's collectives advanced for 3.1 s")
    m.mark_reported()
    assert m.due(9.0) is None  # one report per episode
    m.observe(now_s=9.5, collectives={0: 7})  # progress resumed: a new episode
    assert not m.reported and m.due(12.0) is None and m.due(12.6) is not None


def test_one_rank_advancing_is_progress_and_the_threshold_adapts_to_the_gaps() -> None:
    m = _mon()  # adaptive: max(12 s floor, 5 x p95 of the gaps)
    for i in range(1, 11):
        m.observe(now_s=4.0 * i, collectives={0: i, 1: 1})
    d = m.evaluate(40.0 + 19.0)
    assert d.threshold_s == 20.0 and not d.stalled  # 5 x 4 s gaps
    assert m.evaluate(40.0 + 20.5).stalled


def test_reported_steps_win_over_collectives() -> None:
    m = _mon(stall_timeout_s=3)
    m.observe(now_s=1.0, metrics=[{"rank": 0, "step": 1}], collectives={0: 5})
    m.observe(now_s=3.0, collectives={0: 9})  # collectives move, steps do not
    assert m.progress == "step" and m.due(4.5) is not None


def test_first_collective_timeout_covers_a_slow_start() -> None:
    m = _mon(stall_timeout_s=3, first_step_timeout_s=20)
    assert m.due(19.0) is None
    due = m.due(21.0)
    assert due is not None and due.decision.reason == "first_step"


def test_probe_files_round_trip(tmp_path: Path) -> None:
    probe_files.progress_path(tmp_path, 1).write_text(json.dumps(
        {"pid": 7, "time": 1.0, "collectives": {"0": {"enqueued": 9, "completed": 8},
                                                "1": {"enqueued": 3, "completed": 3}}}))
    prog = probe_files.read_progress(tmp_path, 1, root=tmp_path)
    assert prog is not None and probe_files.collective_count(prog["collectives"]) == 12
    assert probe_files.collective_count({"0": {"enqueued": -1}}) is None
    assert probe_files.read_progress(tmp_path, 2, root=tmp_path) is None
    out = tmp_path / "ans"
    probe_files.ask(tmp_path, 1, out=out, request_id="r0", root=tmp_path, native=False)
    assert json.loads(probe_files.request_path(tmp_path, 1).read_text()) == {
        "id": "r0", "out": str(out), "native": False}
    probe_files.ask(tmp_path, 1, out=out, request_id="r1", root=tmp_path)
    assert json.loads(probe_files.request_path(tmp_path, 1).read_text()) == {
        "id": "r1", "out": str(out), "native": True}
    out.mkdir()
    (out / "probe.json").write_text(json.dumps({"id": "r0"}))  # an older answer
    assert probe_files.await_answer(out, request_id="r1", timeout_s=0.2, root=tmp_path) is None
    assert probe_files.await_answer(out, request_id="r1", timeout_s=30, root=tmp_path,
                                    alive=lambda: False) is None  # gone: no 30 s wait
    (out / "probe.json").write_text(json.dumps({
        "id": "r1", "pid": 7, "user_frame": "train.py:3 in f()", "top_frame": "sleep at x:1",
        "pending": [{"op": "all_reduce"}], "process_groups": {"0": {"ranks": [0, 1]}}}))
    info = probe_files.await_answer(out, request_id="r1", timeout_s=1, root=tmp_path)
    assert info is not None
    s = probe_files.rank_summary(info, rank=1, out=out, root=tmp_path)
    assert (s["rank"], s["top_of_stack"], s["fr_dump"]) == (1, "train.py:3 in f()", None)
    assert s["pending"] == [{"op": "all_reduce"}]


def test_torchrun_world_size_and_launcher_env(tmp_path: Path) -> None:
    assert world_size_of(["torchrun", "--nproc_per_node=4", "t.py"]) == 4
    assert world_size_of(["torchrun", "--nnodes", "2", "--nproc-per-node", "3", "t.py"]) == 6
    assert world_size_of(["torchrun", "--nproc_per_node=gpu", "t.py"]) is None
    env = launcher_env({"PYTHONPATH": "/mine", "NCCL_DEBUG": "INFO"}, out=tmp_path)
    first, rest = env["PYTHONPATH"].split(":", 1)
    assert first.endswith("meshyard/_autoprobe") and rest == "/mine"
    assert (Path(first) / "sitecustomize.py").is_file()
    assert env["NCCL_DEBUG"] == "INFO" and env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert env["MESHYARD_PROBE_DIR"] == str(tmp_path / "probe")


def test_a_clean_exit_among_failures_is_the_one_named() -> None:
    why = _exits({0: {"exited": {"error": "RuntimeError: Connection closed by peer"}},
                  1: {"exited": {"error": None}}, 2: {}})
    assert why[1].startswith("exit code 0") and "Connection closed" in why[0]
    assert "signal" in why[2]
    assert list(_blame(why)) == [1]
    assert list(_blame({0: why[0], 2: why[2]})) == [2]  # killed, not its erroring peer
    assert sorted(_blame({0: why[0], 3: why[0]})) == [0, 3]


def test_user_frame_skips_library_frames(tmp_path: Path) -> None:
    # The user's save() calls into json (the library); json calls back into a hook that
    # hands over json's own frame, as a side thread sees a rank blocked inside a library.
    user = tmp_path / "train.py"
    user.write_text("import json, sys\n\n"
                    "def save(seen):\n"
                    "    return json.dumps(object(), default=lambda o: seen.append(sys._getframe(1)))\n")
    ns = runpy.run_path(str(user))
    seen: list = []
    ns["save"](seen)
    assert not _frames.is_user_file(seen[0].f_code.co_filename)  # json/encoder.py
    assert _frames.user_frame(seen[0]) == (
        "train.py:4 in save(): `return json.dumps(object(), "
        "default=lambda o: seen.append(sys._getframe(1)))`")
    assert not _frames.is_user_file(json.__file__)
    assert not _frames.is_user_file(_frames.__file__)


def test_every_stack_is_walked_before_a_line_is_read() -> None:
    """A thread in a generator expression runs on while the stacks are formatted (reading
    source lines releases the GIL): each chain was taken first, so its stack still reaches
    the generator's caller, and the training thread is marked."""
    stop, inside = threading.Event(), threading.Event()

    def step(i: int) -> int:
        inside.set()
        return i * 2

    def train_loop() -> None:
        while not stop.is_set():
            sum(step(i) for i in range(1000))

    t = threading.Thread(target=train_loop, name="spinner", daemon=True)
    t.start()
    try:
        assert inside.wait(10)
        for _ in range(20):
            walked = _frames.walk_threads(sys._current_frames())
            time.sleep(0.01)  # the spinner's generators suspend and finish meanwhile
            text = _frames.format_walked(walked[t.ident])
            assert "in train_loop" in text, text
            assert text.index("in run") < text.index("in train_loop")  # outermost first
            stacks = _frames.stacks_by_thread_name(_frames.walk_threads(sys._current_frames()),
                                                   training=t.ident)
            assert "in train_loop" in stacks["spinner (training)"]
    finally:
        stop.set()
        t.join(10)


def test_a_stall_after_every_rank_exited_cleanly_is_the_end_not_a_hang(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last ranks of a finished job can take longer than the stall threshold to tear down;
    once every rank has exited 0, the stall rule does not fire."""
    from api.cli import local_watch
    from api.cli.local_watch import LocalWatch

    monkeypatch.setattr(local_watch, "ANSWER_S", 0.2)  # rank 1's probe below never answers

    now = [0.0]
    watch = LocalWatch(["true"], out=tmp_path, policy=Watchdog(stall_timeout_s=3),
                       clock=lambda: now[0])
    watch._monitor = HangMonitor.from_spec(watch.policy, world_size=2, now_s=0.0)
    (tmp_path / "probe").mkdir()
    dead_pid = 2**22 + 12345  # above the default pid_max: no such process
    for r in (0, 1):
        probe_files.progress_path(tmp_path / "probe", r).write_text(json.dumps(
            {"pid": dead_pid, "collectives": {"0": {"enqueued": 5, "completed": 5}},
             "exited": {"error": None}}))
    assert watch._tick() is False
    now[0] = 60.0  # far past the stall threshold, nobody advanced
    assert watch._tick() is False and watch.reports == []
    probe_files.progress_path(tmp_path / "probe", 1).write_text(json.dumps(
        {"pid": os.getpid(), "collectives": {"0": {"enqueued": 6, "completed": 5}}}))
    watch._gone.discard(1)
    now[0] = 120.0  # rank 1 still runs and waits in a collective rank 0 never entered
    assert watch._tick() is False
    now[0] = 123.5  # past the stall threshold since rank 1's last collective: a hang
    assert watch._tick() is True and len(watch.reports) == 1
    assert list(watch.reports[0].culprit_ranks) == [0]


def test_the_last_rank_tearing_down_after_a_clean_peer_left_is_not_a_hang(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 finished and exited 0; rank 1 did the same collectives and is still tearing
    down (destroying its groups on a loaded host), longer than the stall threshold. The stall
    rule holds for FINISHING_WAIT_S; a rank 1 still there after it is reported."""
    from api.cli import local_watch
    from api.cli.local_watch import FINISHING_WAIT_S

    monkeypatch.setattr(local_watch, "ANSWER_S", 0.2)  # rank 1's probe below never answers
    now = [0.0]
    done = {"0": {"enqueued": 30, "completed": 30}, "1": {"enqueued": 4, "completed": 4}}
    w = _watch_of(tmp_path, now, {
        0: {"pid": 2**22 + 12345, "collectives": done, "exited": {"error": None}},
        1: {"pid": os.getpid(), "collectives": {**done, "0": {"enqueued": 29}}}},
        stall_timeout_s=3)
    assert w._tick() is False
    now[0] = 1.0
    _advance(tmp_path, 1, done)
    assert w._tick() is False
    for t in (4.5, 10.0, FINISHING_WAIT_S - 0.5):  # past the stall threshold, within the wait
        now[0] = t
        assert w._tick() is False and w.reports == [], t
    now[0] = FINISHING_WAIT_S + 0.5
    assert w._tick() is True and len(w.reports) == 1


@pytest.mark.parametrize(("leaver", "before", "after", "reported"), [
    # rank 1 enqueued a collective on group "1", which rank 0 was in and never did: a hang
    ({"0": 9, "1": 3}, {"0": 9, "1": 3}, {"0": 9, "1": 4}, True),
    # rank 1 went on on group "2", of which rank 0 has no record (not its member): it holds
    ({"0": 9}, {"0": 9, "2": 39}, {"0": 9, "2": 40}, False),
], ids=["shared-group", "group-the-leaver-was-not-in"])
def test_a_live_rank_past_a_clean_leaver_on_any_shared_group_is_a_hang_at_the_threshold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leaver: dict[str, int],
        before: dict[str, int], after: dict[str, int], reported: bool) -> None:
    """The hold is only for ranks that entered nothing the leaver did not: a collective on a
    group the clean leaver was in and never did fires the stall rule at its threshold,
    naming the leaver. A group the leaver has no record of says nothing either way."""
    from api.cli import local_watch

    def groups(seqs: dict[str, int]) -> dict[str, dict[str, int]]:
        return {pg: {"enqueued": n, "completed": n} for pg, n in seqs.items()}

    monkeypatch.setattr(local_watch, "ANSWER_S", 0.2)
    now = [0.0]
    w = _watch_of(tmp_path, now, {
        0: {"pid": 2**22 + 12345, "exited": {"error": None}, "collectives": groups(leaver)},
        1: {"pid": os.getpid(), "collectives": groups(before)}}, stall_timeout_s=3)
    assert w._tick() is False
    now[0] = 1.0
    _advance(tmp_path, 1, groups(after))
    assert w._tick() is False
    now[0] = 4.5
    if reported:
        assert w._tick() is True and list(w.reports[0].culprit_ranks) == [0]
    else:
        assert w._tick() is False and w.reports == []


def _advance(out: Path, rank: int, collectives: dict) -> None:
    """Rank `rank` (this process, alive) recorded `collectives`."""
    probe_files.progress_path(out / "probe", rank).write_text(json.dumps(
        {"pid": os.getpid(), "collectives": collectives}))


def _watch_of(out: Path, now: list[float], progress: dict[int, dict], *,
              stall_timeout_s: float) -> Any:
    """A LocalWatch of a 2-rank job on the clock `now[0]`, its probe files holding
    `progress` per rank (nothing launched: the tests call `_tick` themselves)."""
    from api.cli.local_watch import LocalWatch

    w = LocalWatch(["true"], out=out, policy=Watchdog(stall_timeout_s=stall_timeout_s),
                   clock=lambda: now[0])
    w._monitor = HangMonitor.from_spec(w.policy, world_size=2, now_s=0.0)
    (out / "probe").mkdir(parents=True)
    for r, prog in progress.items():
        probe_files.progress_path(out / "probe", r).write_text(json.dumps(prog))
    return w


def test_ranks_killed_together_wait_for_the_launchers_first_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gloo aborts rank 0 (SIGABRT) and torchrun kills rank 1 right after: seen gone in one
    look, neither with an exit of its own. The watch waits for torchrun's failure summary and
    names the rank it calls the root cause; with no summary it names both, in time."""
    from api.cli import local_watch
    from api.cli.local_watch import ROOT_CAUSE_WAIT_S, LocalWatch

    monkeypatch.setattr(local_watch, "ANSWER_S", 0.2)
    now = [0.0]

    def watch_with_dead_ranks(out: Path) -> LocalWatch:
        w = _watch_of(out, now, {r: {"pid": 2**22 + 12345 + r, "collectives": {
            "0": {"enqueued": 4, "completed": 3}}} for r in (0, 1)}, stall_timeout_s=3)
        (out / "logs").mkdir()
        w._launcher_log = out / "logs" / "launcher.log"
        w._launcher_log.write_text("[rank1]: RuntimeError: Connection reset by peer\n")
        return w

    w = watch_with_dead_ranks(tmp_path / "a")
    assert w._tick() is False and w.reports == []  # no summary yet: wait
    assert w._launcher_log is not None
    w._launcher_log.write_text(w._launcher_log.read_text() + (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        + "=" * 60 + "\ntrain.py FAILED\n" + "-" * 60 + "\nFailures:\n[1]:\n"
        "  time      : 2026-12-01_20:51:00\n  host      : vm\n  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -15 (pid: 2)\n  error_file: <N/A>\n"
        "  traceback : Signal 15 (SIGTERM) received by PID 2\n" + "-" * 60 + "\n"
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-01_20:51:00\n"
        "  host      : vm\n  rank      : 0 (local_rank: 0)\n  exitcode  : -6 (pid: 1)\n"
        "  error_file: <N/A>\n  traceback : Signal 6 (SIGABRT) received by PID 1\n"
        + "=" * 60 + "\n"))
    now[0] = 0.5
    assert w._tick() is True
    assert [list(r.culprit_ranks) for r in w.reports] == [[0]]

    now[0] = 0.0
    w = watch_with_dead_ranks(tmp_path / "b")
    assert w._tick() is False
    now[0] = ROOT_CAUSE_WAIT_S + 1  # the launcher never said: both are named
    assert w._tick() is True and sorted(w.reports[0].culprit_ranks) == [0, 1]


def test_a_rank_that_recorded_a_clean_exit_is_named_while_its_process_still_finalizes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 returned (its probe recorded exit 0) but its process is still tearing down when
    rank 0 fails of it ("Connection closed by peer") and is gone: rank 1 is the one named."""
    from api.cli import local_watch
    from api.cli.local_watch import LocalWatch

    monkeypatch.setattr(local_watch, "ANSWER_S", 0.2)
    watch = LocalWatch(["true"], out=tmp_path, policy=Watchdog(stall_timeout_s=30),
                       clock=lambda: 1.0)
    watch._monitor = HangMonitor.from_spec(watch.policy, world_size=2, now_s=0.0)
    (tmp_path / "probe").mkdir()
    probe_files.progress_path(tmp_path / "probe", 0).write_text(json.dumps(
        {"pid": 2**22 + 12345, "collectives": {"0": {"enqueued": 7, "completed": 6}},
         "exited": {"error": "RuntimeError: Connection closed by peer"}}))
    probe_files.progress_path(tmp_path / "probe", 1).write_text(json.dumps(
        {"pid": os.getpid(), "collectives": {"0": {"enqueued": 6, "completed": 6}},
         "exited": {"error": None}}))
    assert watch._tick() is True
    assert [list(r.culprit_ranks) for r in watch.reports] == [[1]]


def test_a_rank_that_only_lost_its_peer_waits_for_the_peer_to_be_seen_leaving(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 failed with "Connection closed by peer" and is gone; rank 1, which returned
    early, has not recorded its exit yet (its process is still finalizing on a loaded host).
    The watch does not blame rank 0 for losing its peer: it waits, names rank 1 once its
    clean exit shows, and names rank 0 only when rank 1 never shows within the wait."""
    from api.cli import local_watch
    from api.cli.local_watch import ROOT_CAUSE_WAIT_S, LocalWatch

    monkeypatch.setattr(local_watch, "ANSWER_S", 0.2)
    now = [0.0]

    def watch_with_a_lost_rank_0(out: Path) -> LocalWatch:
        return _watch_of(out, now, {
            0: {"pid": 2**22 + 12345, "collectives": {"0": {"enqueued": 7, "completed": 6}},
                "exited": {"error": "RuntimeError: Connection closed by peer [127.0.0.1]:4"}},
            1: {"pid": os.getpid(), "collectives": {"0": {"enqueued": 6, "completed": 6}}}},
            stall_timeout_s=300)

    w = watch_with_a_lost_rank_0(tmp_path / "a")
    assert w._tick() is False and w.reports == []
    now[0] = 2.0
    probe_files.progress_path(tmp_path / "a" / "probe", 1).write_text(json.dumps(
        {"pid": os.getpid(), "collectives": {"0": {"enqueued": 6, "completed": 6}},
         "exited": {"error": None}}))
    assert w._tick() is True
    assert [list(r.culprit_ranks) for r in w.reports] == [[1]]

    now[0] = 0.0
    w = watch_with_a_lost_rank_0(tmp_path / "b")
    assert w._tick() is False
    now[0] = ROOT_CAUSE_WAIT_S / 2
    assert w._tick() is False and w.reports == []
    now[0] = ROOT_CAUSE_WAIT_S + 1  # rank 1 never showed: rank 0's end is what is known
    assert w._tick() is True and [list(r.culprit_ranks) for r in w.reports] == [[0]]


def test_a_hostile_collective_count_is_capped_for_the_store() -> None:
    huge = {"0": {"enqueued": 10**30}, "1": {"enqueued": 5}, "2": {"enqueued": True}}
    assert probe_files.collective_count(huge) == probe_files.MAX_COLLECTIVES
    assert probe_files.collective_count({"0": {"enqueued": "7"}}) is None


def test_a_request_without_native_stacks_takes_no_py_spy_dump(tmp_path):
    """py-spy stops the process it reads (seconds with native frames): the straggler probe of
    a training job asks without it; a hang round keeps it (py-spy is a test dependency)."""
    import threading

    from meshyard import _probe

    answers: dict[str, dict] = {}

    def probe() -> None:  # from a side thread, as the probe thread answers
        answers["full"] = _probe.collect(tmp_path / "full", request_id="full")
        answers["light"] = _probe.collect(tmp_path / "light", request_id="light", native=False)

    t = threading.Thread(target=probe)
    t.start()
    t.join(60)
    full, light = answers["full"], answers["light"]
    assert "Thread " in (tmp_path / "full" / "pyspy.txt").read_text(), full["errors"]
    assert not (tmp_path / "light" / "pyspy.txt").exists()
    assert light["stacks"] and (tmp_path / "light" / "stacks.txt").is_file()
    assert json.loads((tmp_path / "light" / "probe.json").read_text())["id"] == "light"


def test_threads_writing_one_progress_file_at_once_leave_it_whole(tmp_path: Path) -> None:
    """The probe's thread and its exit hook may write a rank's progress file at the same
    moment: each write lands whole or not at all, never one's head over the other's tail
    (a healthy rank's file once read as garbage, and the watcher took it for killed)."""
    from meshyard._probe import write_json_atomic

    path = probe_files.progress_path(tmp_path, 0)
    long = {"pid": 1, "collectives": {str(g): {"enqueued": 25, "completed": 25}
                                      for g in range(40)}, "exited": {"error": None}}
    short = {"pid": 1, "collectives": {}}
    stop = threading.Event()
    bad: list[str] = []

    def write(doc: dict[str, Any]) -> None:
        for _ in range(300):
            write_json_atomic(path, doc)

    def read() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                text = path.read_text()
                try:
                    assert json.loads(text) in (long, short)
                except (ValueError, AssertionError):
                    bad.append(text[:200])

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(d,)) for d in (long, short, long, short)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=60)
    stop.set()
    reader.join(timeout=10)
    assert not bad, bad[:3]
    assert json.loads(path.read_text()) in (long, short)
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_exit_record_is_the_last_word_and_keeps_the_last_counts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the user's code destroyed its groups the probe's thread reads no counts: the
    last ones stand in the file, and the exit record, written by the exit hook, keeps them;
    a write the thread makes after it does not replace it."""
    from meshyard import _probe

    counts = {"0": {"enqueued": 25, "completed": 25}}
    marks: list[dict[str, dict[str, int]]] = [counts]
    reads: list[int] = [0]  # the thread's reads of the counts, one a wake

    def watermarks() -> dict[str, dict[str, int]]:
        reads[0] += 1
        return marks[0]

    monkeypatch.setattr(_probe, "watermarks", watermarks)
    probe = _probe.Probe(tmp_path, rank=0, interval_s=0.05)
    probe.start()
    try:
        path = probe_files.progress_path(tmp_path, 0)
        deadline = time.monotonic() + 30
        while json.loads(path.read_text())["collectives"] != counts:
            assert time.monotonic() < deadline, path.read_text()
            time.sleep(0.05)
        marks[0] = {}  # the groups are gone
        seen = reads[0]
        while reads[0] < seen + 3:  # the thread has read "no groups" at least twice
            assert time.monotonic() < deadline, "the probe's thread stopped waking"
            time.sleep(0.05)
        assert json.loads(path.read_text())["collectives"] == counts
        probe._at_exit()
        probe._write_progress({"1": {"enqueued": 1, "completed": 1}})
        got = json.loads(path.read_text())
        assert got["collectives"] == counts and got["exited"]["error"] is None
    finally:
        probe.stop()
        probe.thread.join(timeout=10)
        atexit.unregister(probe._at_exit)  # not again when pytest's interpreter exits
        with contextlib.suppress(RuntimeError):  # the exit hook keeps the c10d lock it took
            _probe._C10D_LOCK.release()
