"""Recommendations come from the evidence of the job they are about."""

from __future__ import annotations

from orchestrator.watchdog.advice import JobFacts, recommendations
from orchestrator.watchdog.analyze import analyze
from orchestrator.watchdog.inputs import AnalysisInput, RankEvidence, analysis_input
from orchestrator.watchdog.report import RankLocation, Verdict
from tests.unit.watchdog.synth import Job, Op, evidence


def _text(recs: tuple[str, ...]) -> str:
    return "\n".join(recs)


def _with_locations(inp: AnalysisInput, where: dict[int, RankLocation]) -> AnalysisInput:
    return AnalysisInput(ranks=inp.ranks, world_size=inp.world_size, pg_members=inp.pg_members,
                         pg_names=inp.pg_names, locations=where, trigger=inp.trigger)


def _not_joined(world: int = 4) -> AnalysisInput:
    job = Job(world=world, groups={"0": tuple(range(world))}, program=[Op("0")] * 4,
              stop_before={1: 3})
    return evidence(job)


def test_a_cpu_job_gets_no_gpu_advice_and_no_exited_rank_when_none_exited():
    cpu = {r: RankLocation(node="c1") for r in range(4)}
    rep = analyze(_with_locations(_not_joined(), cpu))
    assert rep.verdict is Verdict.NOT_JOINED
    text = _text(rep.recommendations)
    assert "GPU" not in text and "cuda" not in text and "NCCL" not in text
    assert "exited rank" not in text
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in text and "same collectives" in text


def test_a_gpu_job_keeps_device_binding_advice():
    gpu = {r: RankLocation(node=f"n{r // 2}", gpu=r % 2) for r in range(4)}
    text = _text(analyze(_with_locations(_not_joined(), gpu)).recommendations)
    assert "torch.cuda.set_device(local_rank)" in text and "NCCL_DEBUG=INFO" in text
    assert "exited rank" not in text


def test_a_crash_points_at_the_exited_rank_and_its_own_error():
    inp = analysis_input({}, world_size=2, dead={0: "ValueError: bad shard", 1: (
        "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:42119")}, exit_times={0: 1.0, 1: 1.2},
        locations={0: RankLocation(node="c1"), 1: RankLocation(node="c1")})
    rep = analyze(inp)
    assert (rep.verdict, rep.culprit_ranks) == (Verdict.RANK_EXITED, (0,))
    assert rep.recommendations[0].startswith("Read the exited rank's error and traceback")
    assert "exited rank's exit code" in _text(rep.recommendations)
    assert "GPU" not in _text(rep.recommendations)


def test_a_straggler_on_one_cpu_node_gets_no_nic_or_hardware_advice():
    times = {r: {("0", s): s * 0.3 + (0.2 if r == 1 else 0.0) for s in range(1, 30)}
             for r in range(2)}
    ranks = tuple(RankEvidence(rank=r, enter_times=t) for r, t in times.items())
    rep = analyze(AnalysisInput(ranks=ranks, world_size=2, trigger="straggler",
                                locations={r: RankLocation(node="c1") for r in range(2)}))
    assert (rep.verdict, rep.culprit_ranks) == (Verdict.STRAGGLER, (1,))
    text = _text(rep.recommendations)
    assert text.startswith("Profile the slow rank")
    assert "NIC" not in text and "nccl-tests" not in text


def test_network_evidence_brings_the_nic_advice_back():
    facts = JobFacts(gpus=True, exited=False, multi_node=False, network_errors=True)
    assert any("InfiniBand" in t for t in recommendations(Verdict.STRAGGLER, facts))
    assert not any("InfiniBand" in t for t in recommendations(
        Verdict.STRAGGLER, JobFacts(gpus=True, exited=False, multi_node=False)))


def test_unknown_facts_rule_nothing_out_but_a_hardware_test_needs_suspect_hardware():
    text = _text(recommendations(Verdict.UNKNOWN))
    assert "set_device" in text and "exited rank" in text and "InfiniBand" in text
    assert "nccl-tests" not in text
    assert "nccl-tests" in _text(recommendations(Verdict.UNKNOWN,
                                                 JobFacts(suspect_hardware=True)))
