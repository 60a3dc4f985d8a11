import pytest

from orchestrator.runtime.failures import (
    Blame,
    RankFailure,
    attempt_failed,
    blame,
    cause_first,
    first_cause,
    group_failures,
    mask_secrets,
    normalise,
    raised_at,
    rank_end_states,
    summarise,
    user_error_message,
)
from orchestrator.runtime.policy import nodes_failed_twice
from orchestrator.watchdog.report import DiagnosisReport, Verdict

# What torch 2.x's gloo backend raises in a peer of a rank that died (a real job's text).
GLOO_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
               "Connection closed by peer [127.0.0.1]:{port}. This is typically caused by a "
               "remote worker crashing. Check the logs of the remote worker before reporting "
               "an error. GLHF!")


def test_normalise_replaces_numbers_ids_and_addresses():
    msg = "Connection closed by peer [127.0.0.1]:45678 at 0x7f00ab, actor 3fa9c2d1e4b5a6978877"
    assert normalise(msg) == "Connection closed by peer <ADDR> at <HEX>, actor <ID>"
    assert normalise("rank 3 failed at step 17\nTraceback ...") == "rank <N> failed at step <N>"


def test_many_ranks_with_the_same_error_form_one_group_first_failure_first():
    fs = [RankFailure(rank=7, node="n2", error_type="WorkerDied", message="exit code 43")]
    fs += [RankFailure(rank=r, node=f"n{r % 2}", error_type="RuntimeError",
                       message=f"[pair.cc:{500 + r}] Connection closed by peer [10.0.0.{r}]:{4000 + r}")
           for r in range(64) if r != 7]
    groups = group_failures(fs)
    assert [len(g.ranks) for g in groups] == [1, 63]
    assert groups[0].ranks == (7,) and groups[0].nodes == ("n2",)
    assert groups[1].nodes == ("n0", "n1")
    assert groups[1].peer_lost and not groups[0].peer_lost
    text = summarise(groups)
    assert text.startswith("rank 7 on n2: WorkerDied: exit code 43; then 63 ranks (0-6,8-63) "
                           "on 2 nodes lost a peer (RuntimeError: [pair.cc:500] Connection "
                           "closed by peer [10.0.0.0]:4000)")
    assert "<N>" not in text and "<ADDR>" not in text


def _script_crash() -> list[RankFailure]:
    """A 3-rank script: rank 1 raised; ranks 0 and 2 failed of it, and rank 0's error reached
    the controller first."""
    return [
        RankFailure(rank=0, node="c1", error_type="RuntimeError", exit_code=1, time=10.1,
                    message=GLOO_CLOSED.format(port=42119)),
        RankFailure(rank=1, node="c1", error_type="ValueError", exit_code=1, time=10.6,
                    message="corrupt record in shard-00017.bin at step 3 (code 4242)"),
        RankFailure(rank=2, node="c1", error_type="RuntimeError", exit_code=1, time=10.2,
                    message=GLOO_CLOSED.format(port=64188)),
    ]


def test_the_rank_that_raised_leads_and_the_peers_that_lost_it_fold_into_one_clause():
    fs = cause_first(_script_crash())
    assert [f.rank for f in fs] == [1, 0, 2]
    groups = group_failures(fs)
    assert [(g.ranks, g.peer_lost) for g in groups] == [((1,), False), ((0, 2), True)]
    text = summarise(groups)
    assert text == ("rank 1 on c1: ValueError: corrupt record in shard-00017.bin at step 3 "
                    "(code 4242) (exit code 1); then 2 ranks (0,2) on c1 lost a peer "
                    "(RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                    "pair.cc:553] Connection closed by peer [127.0.0.1]:42119. This is "
                    "typically caused by a remote worker crashing.)")
    # The grouping key is still normalised: the two peers' texts differ only in ports.
    assert groups[1].signature.endswith("Connection closed by peer <ADDR>. This is typically "
                                        "caused by a remote worker crashing. Check the logs of "
                                        "the remote worker before reporting an error. GLHF!")
    d = groups[0].to_dict()
    assert d["message"] == "ValueError: corrupt record in shard-00017.bin at step 3 (code 4242)"
    assert d["example"] == "corrupt record in shard-00017.bin at step 3 (code 4242)"


def test_attempt_failed_on_a_rank_exit_leads_with_the_exception_and_its_numbers():
    report = DiagnosisReport(verdict=Verdict.RANK_EXITED, culprit_ranks=(1,), confidence=0.9,
                             summary="Rank 1 exited (ValueError: corrupt record).")
    failed = attempt_failed(_script_crash(), report)
    assert failed.message.startswith("rank 1 on c1: ValueError: corrupt record in "
                                     "shard-00017.bin at step 3 (code 4242) (exit code 1); "
                                     "then 2 ranks (0,2) on c1 lost a peer")
    assert [g.ranks for g in failed.groups] == [(1,), (0, 2)]


def test_errno_and_paths_with_digits_are_shown_as_written():
    f = RankFailure(rank=0, node="n1", error_type="FileNotFoundError",
                    message="[Errno 2] No such file or directory: '/data/run-2024/shard-3.bin'")
    (g,) = group_failures([f])
    assert summarise([g]) == ("rank 0 on n1: FileNotFoundError: [Errno 2] No such file or "
                              "directory: '/data/run-2024/shard-3.bin'")


def test_secrets_are_masked_everywhere_a_reader_sees_them_and_nothing_else_is():
    key, token = "wandb-0123456789abcdef", "msy_" + "Ab3_" * 8
    f = RankFailure(rank=2, node="n1", error_type="PermissionError", exit_code=1,
                    message=f"[Errno 13] login with {key} refused (token {token}) at step 40",
                    traceback=f"Traceback ...\n  File \"train.py\", line 9\nKEY={key}\n")
    failed = attempt_failed([f], None, secrets=[key, "1", ""])
    (g,) = failed.groups
    for text in (failed.message, g.signature, g.example, g.traceback, g.message):
        assert key not in text and token not in text
    assert failed.message == ("rank 2 on n1: PermissionError: [Errno 13] login with *** refused "
                              "(token ***) at step 40 (exit code 1)")
    assert "line 9" in g.traceback and "KEY=***" in g.traceback
    # A one-character "secret" would mask digits everywhere: values that short are not masked.
    assert mask_secrets("step 1 of 10", ["1"]) == "step 1 of 10"


def test_nodes_failed_twice_counts_attempts_not_ranks():
    assert nodes_failed_twice([["a", "a", "b"], ["b"], ["c"]]) == {"b"}
    assert nodes_failed_twice([["a"]]) == set()


USER_TB = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/meshyard/runner.py", line 120, in main
    fn(config)
  File "/tmp/meshyard-code/train.py", line 31, in train_func
    model.step()
  File "/tmp/meshyard-code/model.py", line 12, in step
    return self.optim.stepp()
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1940, in __getattr__
    raise AttributeError(
AttributeError: 'SGD' object has no attribute 'stepp'
"""


@pytest.mark.parametrize(("failure", "user_code", "expected"), [
    (RankFailure(rank=1, error_type="AttributeError", message="no stepp", traceback=USER_TB,
                 exit_code=1), True, Blame.USER),
    # the worker could not start the rank process: meshyard's failure, not the user's
    (RankFailure(rank=0, error_type="FileNotFoundError",
                 message="[Errno 2] No such file or directory: '/venv/bin/python'"), True,
     Blame.INFRA),
    (RankFailure(rank=1, error_type="ExitCode", message="the rank process exited",
                 exit_code=3), True, Blame.USER),
    (RankFailure(rank=1, error_type="Signal", message="killed by SIGKILL", exit_code=-9),
     True, Blame.INFRA),
    (RankFailure(rank=0, error_type="RuntimeError",
                 message="[../gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                         "[10.0.0.2]:4120"), True, Blame.INFRA),
    (RankFailure(rank=0, error_type="DistBackendError", message="NCCL watchdog timeout"),
     True, Blame.INFRA),
    (RankFailure(rank=2, error_type="WorkerDied", message="The actor died unexpectedly"),
     True, Blame.NODE),
    (RankFailure(rank=2, error_type="RuntimeError",
                 message="CUDA error: uncorrectable ECC error encountered"), True, Blame.NODE),
    (RankFailure(rank=2, error_type="RuntimeError", message="NET/IB : Got completion from "
                 "peer 10.0.0.3 with error 12, opcode 0, len 0, vendor err 129"), False,
     Blame.NODE),
    # the built-in loop's own exception is not the user's: restarted by count, no node named
    (RankFailure(rank=1, error_type="ValueError", message="bad shard"), False, Blame.INFRA),
])
def test_blame_names_the_user_only_for_their_own_errors_and_the_node_only_on_evidence(
        failure: RankFailure, user_code: bool, expected: Blame) -> None:
    assert blame(failure, user_code=user_code) is expected


def test_a_user_error_leads_with_the_exception_and_the_users_own_line() -> None:
    assert raised_at(USER_TB) == "model.py:12 in step"
    f = RankFailure(rank=1, node="n1", error_type="AttributeError",
                    message="'SGD' object has no attribute 'stepp'", traceback=USER_TB)
    msg = user_error_message(f, "rank 1 on n1: AttributeError: ...; then 2 ranks (0,2) on n1 "
                                "lost a peer (RuntimeError: Connection closed by peer)")
    assert msg.startswith("AttributeError at model.py:12 in step: 'SGD' object has no "
                          "attribute 'stepp' (rank 1 on n1)")
    assert msg.endswith("then 2 ranks (0,2) on n1 lost a peer (RuntimeError: Connection "
                        "closed by peer)")
    exited = RankFailure(rank=0, node="n2", error_type="ExitCode",
                         message="the rank process exited", exit_code=3)
    assert user_error_message(exited, "") == \
        "the rank process exited with code 3 (rank 0 on n2)"
    assert first_cause([RankFailure(rank=0, error_type="RuntimeError",
                                    message="Connection closed by peer"), f]) is f



def test_a_worker_whose_host_is_lost_is_unreachable_not_a_process_exit() -> None:
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    from orchestrator.runtime.gang import _death_message

    lost = ActorUnavailableError("The actor is temporarily unavailable: RpcError: RPC error: "
                                 "recvmsg:Connection reset by peer rpc_code: 14.", b"\x00" * 16)
    assert _death_message(lost).startswith("worker unreachable: its host is down or cut off")
    node_gone = ActorDiedError()
    assert _death_message(node_gone).startswith("worker process died")
    assert _death_message(RuntimeError("The actor died because its node has died. Node Id: x")
                          ).startswith("worker unreachable")


def test_a_rank_that_answers_no_diagnostics_call_names_its_host_unreachable() -> None:
    from orchestrator.runtime.hangwatch import _with_unreachable, unreachable_ranks
    from orchestrator.watchdog.report import DiagnosisReport, Verdict

    replies = {0: {"evidence": {"step": 3}},
               1: {"error": "GetTimeoutError: Get timed out: some object(s) not ready."},
               2: {"error": "ActorUnavailableError: The actor is temporarily unavailable"},
               3: {"error": "ValueError: no stacks"}}
    assert unreachable_ranks(replies) == [1, 2]
    r = DiagnosisReport(verdict=Verdict.NOT_JOINED, culprit_ranks=(1,), confidence=0.9,
                        summary="Rank 1 never entered all_reduce #39.")
    out = _with_unreachable(r, {1: "host-b"})
    assert out.summary == ("Rank 1 never entered all_reduce #39. Host host-b unreachable: "
                           "rank 1 answered no diagnostics call.")
    out = _with_unreachable(r, {1: "host-b"}, {1: 23.4})
    assert out.summary.endswith("Host host-b unreachable: rank 1 answered no poll for 23 s "
                                "while the other ranks answered, and no diagnostics call.")
    assert out.verdict is Verdict.NOT_JOINED and out.culprit_ranks == (1,)


def test_rank_end_states_fail_the_rank_that_raised_and_name_its_peers_lost():
    raised = RankFailure(rank=1, error_type="ValueError", message="bad shard", time=1.0)
    lost = [RankFailure(rank=r, error_type="RuntimeError", time=2.0,
                        message=GLOO_CLOSED.format(port=4000 + r)) for r in (0, 2)]
    assert rank_end_states([raised, *lost], range(4)) == {
        0: "PEER_LOST", 1: "FAILED", 2: "PEER_LOST", 3: "STOPPED"}
    # every failed rank lost a peer (the one that died left no error): none is fallout alone
    assert rank_end_states(lost, range(3)) == {0: "FAILED", 1: "STOPPED", 2: "FAILED"}
    died = RankFailure(rank=1, error_type="WorkerDied", message="Connection closed by peer")
    assert rank_end_states([died, *lost], range(3))[1] == "FAILED"
