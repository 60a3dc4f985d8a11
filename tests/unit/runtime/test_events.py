"""The typed controller protocol: Ray names and their parsers, and values that cross Ray."""

from __future__ import annotations

import doctest
import pickle

from orchestrator.lifecycle import Reason
from orchestrator.placement.gang_plan import Bundle
from orchestrator.runtime import events as events_mod
from orchestrator.runtime.events import (
    AttemptConfig,
    ControllerEvent,
    Diagnosis,
    EventKind,
    Failed,
    Metrics,
    attempt_controller_name,
    controller_name,
    is_spare_controller_name,
    parse_controller_name,
    parse_pg_name,
    pg_name,
    spare_controller_name,
)
from orchestrator.runtime.failures import FailureGroup
from orchestrator.spec import WatchdogAction, parse_spec
from orchestrator.topology.declared import parse_cluster_doc
from orchestrator.watchdog.report import DiagnosisReport, Verdict


def test_names_and_parsers_round_trip() -> None:
    for job, attempt in (("j1", 1), ("a-b-c", 12)):
        assert parse_controller_name(controller_name(job, attempt)) == (job, attempt)
        assert parse_pg_name(pg_name(job, attempt)) == (job, attempt)
    assert parse_controller_name(pg_name("j", 1)) is None
    assert parse_pg_name("meshyard-pg-j-x") is None
    assert parse_pg_name("meshyard-pg--3") is None
    assert parse_controller_name("meshyard-pool") is None


def test_docstring_examples() -> None:
    assert doctest.testmod(events_mod).failed == 0


def test_spare_names_are_no_attempt_names_and_an_attempt_records_which_it_has() -> None:
    spare = spare_controller_name("a1b2c3")
    assert is_spare_controller_name(spare) and parse_controller_name(spare) is None
    assert parse_pg_name(spare) is None
    assert not is_spare_controller_name(controller_name("spare", 1))
    assert not is_spare_controller_name("meshyard-spare-")
    assert attempt_controller_name("j1", 3, {"controller": spare, "bundles": []}) == spare
    for placement in (None, {}, {"controller": ""}, {"controller": 7}):
        assert attempt_controller_name("j1", 3, placement) == controller_name("j1", 3)


def test_attempt_config_pickles_with_its_typed_spec_and_topology() -> None:
    spec = parse_spec({"name": "t", "parallelism": {"dp_replicate": 2}})
    cluster = parse_cluster_doc({"levels": ["leaf"], "nodes": [
        {"name": "n1", "gpus": 2, "intra_node": "nvswitch", "labels": {"leaf": "l0"}}]})
    cfg = AttemptConfig(job_id="j", attempt=2, spec=spec, run_dir="/runs/j",
                        bundles=tuple(Bundle(rank=r, node="n1", node_id="id1", gpu=r,
                                             coords={"dp_replicate": r}, cpus=0.5)
                                      for r in range(2)),
                        placement_timeout_s=30, init_timeout_s=60, cluster=cluster)
    again = pickle.loads(pickle.dumps(cfg))
    assert again == cfg
    assert again.spec.parallelism.dp_replicate == 2 and again.pg_name == "meshyard-pg-j-2"
    assert again.bundles[1].resources == {"GPU": 1, "CPU": 0.5}
    assert again.log_dir == "/runs/j/logs/attempt-2" and again.world_size == 2


def test_events_know_their_kind_and_terminality_and_pickle() -> None:
    report = DiagnosisReport(verdict=Verdict.NOT_JOINED, culprit_ranks=(1,), confidence=0.9,
                             summary="rank 1 never joined", details={"trigger": "stall"})
    events = [ControllerEvent(seq=1, payload=Metrics(rows=({"rank": 0, "step": 1},))),
              ControllerEvent(seq=2, payload=Diagnosis(report=report, trigger="stall",
                                                       detected_at=1.5)),
              ControllerEvent(seq=3, payload=Failed(
                  reason=Reason.HANG_DETECTED, message="hang detected",
                  groups=(FailureGroup("E: x", (1,), ("n1",), "x", ""),),
                  avoid_nodes=("n1",), hang_action=WatchdogAction.RESTART))]
    assert [e.kind for e in events] == [EventKind.METRICS, EventKind.DIAGNOSIS,
                                        EventKind.FAILED]
    assert [e.terminal for e in events] == [False, False, True]
    again = pickle.loads(pickle.dumps(events))
    assert again[1].payload.report.to_dict() == report.to_dict()
    assert again[2] == events[2]


def test_an_attempts_phase_only_moves_forward_and_reaches_the_poll() -> None:
    from orchestrator.runtime.controller import AttemptController
    from orchestrator.runtime.events import AttemptPhase

    c = AttemptController()  # a spare: no attempt yet
    assert c.poll().phase is AttemptPhase.IDLE
    c._enter(AttemptPhase.RUNNING)
    c._enter(AttemptPhase.PLACING)  # a late caller cannot move it back
    assert c.poll().phase is AttemptPhase.RUNNING
    c._enter(AttemptPhase.ENDED)
    assert c.poll().phase is AttemptPhase.ENDED


def test_a_grown_collective_count_is_progress_dated_by_the_heartbeat() -> None:
    from orchestrator.runtime.events import RankStatus

    r = RankStatus(rank=0).observed(collectives=0, last_heartbeat=10.0)
    assert (r.progress_first_at, r.progress_at) == (None, None)  # nothing run yet
    r = r.observed(collectives=12, last_heartbeat=11.0)
    assert (r.collectives, r.progress_first_at, r.progress_at) == (12, 11.0, 11.0)
    r = r.observed(collectives=12, last_heartbeat=15.0)  # stuck: the dates stay
    assert (r.progress_first_at, r.progress_at) == (11.0, 11.0)
    r = r.observed(collectives=40, last_heartbeat=16.0)
    assert (r.progress_first_at, r.progress_at) == (11.0, 16.0)
    assert "collectives" in RankStatus.STORED and "progress_at" in RankStatus.STORED
