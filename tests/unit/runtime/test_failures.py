from orchestrator.runtime.failures import RankFailure, group_failures, normalise, summarise
from orchestrator.runtime.policy import nodes_failed_twice


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
    text = summarise(groups)
    assert text.startswith("rank 7 on n2: WorkerDied: exit code <N>; 63 ranks (0-6,8-63)")


def test_nodes_failed_twice_counts_attempts_not_ranks():
    assert nodes_failed_twice([["a", "a", "b"], ["b"], ["c"]]) == {"b"}
    assert nodes_failed_twice([["a"]]) == set()
