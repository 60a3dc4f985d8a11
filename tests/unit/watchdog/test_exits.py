"""A rank that ended of its own error is the culprit; ranks whose error says a peer went away
lost it. The texts are what torch, gloo and NCCL print (a real 3-rank gloo job's, and the
shared samples')."""

from __future__ import annotations

from orchestrator.watchdog.analyze import analyze
from orchestrator.watchdog.exits import peer_lost
from orchestrator.watchdog.inputs import analysis_input
from orchestrator.watchdog.report import Verdict

GLOO_CLOSED = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
               "pair.cc:553] Connection closed by peer [127.0.0.1]:{port}. This is typically "
               "caused by a remote worker crashing. Check the logs of the remote worker before "
               "reporting an error. GLHF! \U0001f3d6\ufe0f")
OWN = "ValueError: corrupt record in shard-00017.bin at step 3 (code 4242)"
PEER_TEXTS = [
    GLOO_CLOSED.format(port=42119),
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
    "waiting 1800000ms for recv operation to complete",
    "gpu004:2200689:2200706 [3] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed "
    "by remote peer gpu004.ds-a4-r02.abc.com<55693>",
    "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, "
    "NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.",
    "Signal: the rank process was killed by SIGABRT after: terminate called after throwing an "
    "instance of 'gloo::IoException' what():  [gloo/transport/tcp/pair.cc:598] Connection "
    "reset by peer [10.1.2.3]:8594",
]
OWN_TEXTS = [
    OWN,
    "Signal: the rank process was killed by SIGKILL",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "ExitCode: the rank process exited",
]


def test_peer_lost_reads_the_fallout_texts_and_not_the_causes():
    assert [peer_lost(t) for t in PEER_TEXTS] == [True] * len(PEER_TEXTS)
    assert [peer_lost(t) for t in OWN_TEXTS] == [False] * len(OWN_TEXTS)


def _crash(dead: dict[int, str], times: dict[int, float], world: int = 3):
    return analyze(analysis_input({}, world_size=world, dead=dead, exit_times=times))


def test_the_rank_that_raised_is_the_only_culprit_though_its_peers_ended_with_it():
    # A real run's order: the raising rank's result reached the controller 0.6 s after its
    # peers' "Connection closed by peer".
    rep = _crash({0: GLOO_CLOSED.format(port=42119), 1: OWN, 2: GLOO_CLOSED.format(port=64188)},
                 {1: 1796370981.504, 0: 1796370980.90, 2: 1796370980.95})
    assert rep.verdict is Verdict.RANK_EXITED
    assert rep.culprit_ranks == (1,)
    assert rep.summary.startswith(f"Rank 1 exited ({OWN}); ranks 0, 2 lost it (RuntimeError: ")
    assert rep.summary.count("Connection closed by peer") == 1
    assert rep.details["peer_lost"] == [0, 2]
    assert [e.state for e in rep.evidence] == ["exited"] * 3


def test_without_exit_times_the_own_error_still_wins():
    rep = _crash({0: PEER_TEXTS[1], 1: PEER_TEXTS[0], 2: "Signal: the rank process was killed "
                  "by SIGKILL"}, {})
    assert rep.culprit_ranks == (2,)
    assert rep.summary.startswith("Rank 2 exited (Signal: the rank process was killed by "
                                  "SIGKILL); ranks 0, 1 lost it")


def test_two_ranks_raising_the_same_bug_together_are_both_culprits():
    rep = _crash({0: OWN, 1: OWN, 2: GLOO_CLOSED.format(port=1)}, {0: 5.0, 1: 5.2, 2: 5.3})
    assert rep.culprit_ranks == (0, 1)
    assert "rank 2 lost them" in rep.summary


def test_when_every_rank_lost_a_peer_the_first_to_end_is_named():
    rep = _crash({0: PEER_TEXTS[0], 1: PEER_TEXTS[1]}, {0: 9.0, 1: 3.0}, world=3)
    assert rep.culprit_ranks == (1,)


def test_a_later_own_error_is_not_folded_into_the_first():
    rep = _crash({0: OWN, 1: "KeyError: 'labels'"}, {0: 1.0, 1: 40.0}, world=2)
    assert rep.culprit_ranks == (0,)
    assert "rank 1 ended after it" in rep.summary
