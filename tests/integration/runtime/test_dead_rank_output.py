"""What a rank wrote just before its process died, read from its log file on its node by a
Ray task: started the tick the death is seen, collected when it answers, and waited for by
the attempt's last drain; a read that never answers leaves a line that says where the rank's
whole output is."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import ray

from orchestrator.lifecycle import LogStream
from orchestrator.placement.gang_plan import Bundle
from orchestrator.runtime import gang_output
from orchestrator.runtime.events import AttemptConfig, RankStatus
from orchestrator.runtime.gang_output import RankOutputs
from orchestrator.spec import parse_spec
from workers.host.assignment import RankResult, WorkerState, rank_log_path


def _config(run_dir: Path) -> AttemptConfig:
    spec = parse_spec({"name": "t", "parallelism": {"dp_replicate": 2},
                       "resources": {"device": "cpu"}})
    return AttemptConfig(job_id="j", attempt=1, spec=spec, run_dir=str(run_dir),
                         bundles=tuple(Bundle(rank=r, node="c1", node_id=None, gpu=None,
                                              coords={"dp_replicate": r}, cpus=0.5)
                                       for r in range(2)),
                         placement_timeout_s=30, init_timeout_s=60)


def _dead_rank(tmp_path: Path, ray_connected: Any) -> tuple[RankOutputs, dict[int, Any], dict]:
    cfg = _config(tmp_path)
    log_dir = Path(cfg.log_dir)
    log_dir.mkdir(parents=True)
    rank_log_path(cfg.log_dir, 1, "stdout").write_text("")
    rank_log_path(cfg.log_dir, 1, "stderr").write_text(
        "step 1\nstep 2\nstep 3\n[meshyard fault] crash: rank 1 exits at step 3\n")
    node_id = next(n["NodeID"] for n in ray.nodes() if n["Alive"])
    ranks = {r: RankStatus(rank=r, node="c1", node_id=node_id) for r in range(2)}
    results = {1: RankResult(rank=1, state=WorkerState.ERROR, error_type="WorkerDied",
                             message="the actor died", time=time.time())}
    out = RankOutputs(cfg)
    # the controller had forwarded the first three lines (the anchor)
    out.remember_lines([{"rank": 1, "stream": "stderr", "line": f"step {i}"}
                        for i in (1, 2, 3)])
    out.died(1)
    return out, ranks, results


def test_a_dead_ranks_last_line_is_read_once_and_the_last_drain_waits_for_it(
        tmp_path: Path, ray_connected: Any) -> None:
    out, ranks, results = _dead_rank(tmp_path, ray_connected)
    first = out.dead_ranks_output(ranks, results)  # the read starts; this tick does not wait
    last = out.dead_ranks_output(ranks, results, final=True)
    lines = [(x["rank"], x["stream"], x["line"]) for x in first + last]
    assert lines == [(1, LogStream.STDERR, "[meshyard fault] crash: rank 1 exits at step 3")]
    assert out.dead_ranks_output(ranks, results, final=True) == []  # read once


def _never_answers(reads: list[Any], beneath: str) -> list[Any]:
    time.sleep(60)
    return []


def test_a_read_that_never_answers_names_where_the_output_is(
        tmp_path: Path, ray_connected: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # a node too loaded (or cut off) to run the read in time
    monkeypatch.setattr(gang_output, "unseen_tails", _never_answers)
    monkeypatch.setattr(gang_output, "READ_TIMEOUT_S", 3.0)
    out, ranks, results = _dead_rank(tmp_path, ray_connected)
    assert out.dead_ranks_output(ranks, results) == []  # still under way
    last = out.dead_ranks_output(ranks, results, final=True)
    assert [(x["rank"], x["stream"]) for x in last] == [(1, LogStream.LOG)]
    line = last[0]["line"]
    assert line.startswith("WARNING the last lines rank 1 wrote could not be read from its "
                           "node within 3 s"), line
    assert str(rank_log_path(str(tmp_path / "logs/attempt-1"), 1, "stderr")) in line
    assert line.endswith(" on c1"), line
    assert out.dead_ranks_output(ranks, results, final=True) == []
