"""Every sample in tests/fixtures/logs/ (copied from shared/samples/logs) with its key facts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.watchdog.logs import (
    errors_by_rank,
    parse_lines,
    parse_text,
    split_records,
    strip_prefixes,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def events(name: str, kind: str | None = None) -> list[dict[str, Any]]:
    out = [e.to_dict() for e in parse_text((FIXTURES / name).read_text())]
    return [e for e in out if kind is None or e["kind"] == kind]


def sub(d: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    return {k: d.get(k) for k in keys}


def test_every_fixture_is_covered() -> None:
    covered = {name for name, *_ in CASES} | {"torch_fr_dump_unpickled_tutorial_v2.5.txt"}
    assert covered == {p.name for p in FIXTURES.iterdir()}


# (file, kind, index, expected subset of fields, expected count of that kind)
CASES: list[tuple[str, str, int, dict[str, Any], int]] = [
    ("gloo_timeouts_various.log", "gloo_timeout", 0,
     {"rank": 6, "launcher_name": "trainer22", "op": "recv", "timeout_ms": 1800000,
      "source": "unbound_buffer.cc:81"}, 4),
    ("gloo_timeouts_various.log", "monitored_barrier_failure", 0,
     {"rank": 1, "timeout_ms": 2000}, 1),
    ("gloo_timeouts_various.log", "gloo_connection_closed", 0,
     {"peer": "2401:db00:eef0:1100:3560:0:1c05:25d", "port": 8594}, 1),
    ("nccl_coll_allreduce_2rank_nccl203.log", "nccl_coll", 0,
     {"host": "gpu1", "pid": 13135, "cuda_dev": 0, "op": "AllReduce", "op_count": 0x1a,
      "count": 64, "datatype": 7, "nranks": 2, "truncated": False}, 8),
    ("nccl_coll_allreduce_2rank_nccl203.log", "nccl_coll", 7,
     {"cuda_dev": 0, "op_count": 0x1d, "count": None, "truncated": True}, 8),
    ("nccl_coll_tp_allgather_reducescatter_torchtitan1369.log", "nccl_coll", 5,
     {"pid": 191369, "op": "AllReduce", "op_count": 0x10, "count": 1, "nranks": 2}, 7),
    ("nccl_err_ib_completion_status12_nccl1814.log", "nccl_warn", 0,
     {"host": "hostname-test", "pid": 984, "cuda_dev": 4, "category": "ib_completion_error",
      "ib_status": 12, "vendor_err": 129, "peer": "172.36.143.59<44206>"}, 3),
    ("nccl_err_ib_completion_status12_nccl1814.log", "nccl_retcode", 2,
     {"location": "proxy.cc:874", "code": 6, "context": "Progress Thread"}, 7),
    ("nccl_err_socket_closed_init_stack_ncclTests166.log", "nccl_warn", 0,
     {"host": "gpu004", "cuda_dev": 3, "category": "connection_closed",
      "source": "misc/socket.cc:49"}, 3),
    ("nccl_err_socket_closed_init_stack_ncclTests166.log", "nccl_retcode", 5,
     {"location": "group.cc:65", "code": 3, "context": "Async thread"}, 16),
    ("nccl_init_complete_old_nccl429.log", "nccl_init", 0,
     {"host": "machine-1", "pid": 16194, "rank": 14, "nranks": 16, "cuda_dev": 6,
      "bus_id": "b1000", "comm_id": None, "complete": True}, 2),
    ("nccl_init_complete_old_nccl429.log", "nccl_channels", 0,
     {"coll_channels": 6, "p2p_channels": 8}, 2),
    ("nccl_init_ib_rings_nccl566.log", "nccl_version", 0,
     {"version": "2.10.3", "cuda": "10.2"}, 1),
    ("nccl_init_ib_rings_nccl566.log", "nccl_net", 0,
     {"transport": "IB", "devices": ["mlx5_1:1/IB", "mlx5_3:1/IB", "mlx5_0:1/IB", "mlx5_2:1/IB"],
      "oob": "enP5p1s0f0:192.168.64.50<0>"}, 4),
    ("nccl_init_ib_rings_nccl566.log", "nccl_ring", 0,
     {"channel": 0, "nchannels": 6, "ranks": [0, 1]}, 5),
    ("nccl_init_ib_rings_nccl566.log", "nccl_tree", 0, {"pid": 163375, "trees": 6}, 1),
    ("nccl_init_ib_rings_nccl566.log", "nccl_bootstrap", 0,
     {"interface": "enP5p1s0f0", "address": "192.168.64.50"}, 2),
    ("nccl_init_socket_noib_nccl857.log", "nccl_warn", 0,
     {"host": "ai", "category": "other", "message": "Failed to open libibverbs.so[.1]"}, 3),
    ("nccl_init_socket_noib_nccl857.log", "nccl_net", 0,
     {"transport": "Socket", "devices": ["eth0:162.30.2.40"]}, 6),
    ("nccl_init_socket_noib_nccl857.log", "nccl_version", 0,
     {"version": "2.10.3", "cuda": "11.3"}, 1),
    ("nccl_mpirun_prefixed_horovod3658.log", "nccl_channel", 0,
     {"launcher_rank": 1, "host": "ip-172-31-0-63", "pid": 2121, "channel": 1, "src": 1,
      "dst": 2, "direction": "send", "transport": "Socket"}, 8),
    ("nccl_mpirun_prefixed_horovod3658.log", "nccl_channel", 1,
     {"launcher_rank": 4, "host": "ip-172-31-12-129", "direction": "receive"}, 8),
    ("nccl_p2p_send_recv_hang_nccl584.log", "nccl_coll", 6,
     {"op": "Recv", "op_count": 0xd60, "count": 2420736, "root": 1, "nranks": 2}, 8),
    ("nccl_p2p_send_recv_hang_nccl584.log", "nccl_coll", 7,
     {"op": "Send", "op_count": 0xd64, "truncated": True}, 8),
    ("nccl_ras_mismatch_report_nccl1911.log", "nccl_version", 0,
     {"version": "2.26.2", "cuda": "12.6"}, 1),
    ("nccl_ras_mismatch_report_nccl1911.log", "ras_mismatch", 0,
     {"op": "AllGather", "listed_ranks": [12, 13], "min_op_count": 640, "max_op_count": 641,
      "counts": [{"ranks": 30, "op_count": 640}, {"ranks": 2, "op_count": 641}]}, 1),
    ("torch_desync_debug_report_pytorch152623.log", "desync_report", 0,
     {"rank": 0, "timeout_op": "ALLREDUCE", "timeout_seq": 315, "culprit_ranks": [7]}, 1),
    ("torch_desync_debug_report_pytorch152623.log", "torch_watchdog_timeout", 0,
     {"rank": 0, "seq": 241, "op_type": "ALLREDUCE", "numel_in": 6, "timeout_ms": 600000,
      "ran_ms": 600086}, 1),
    ("torch_desync_debug_report_pytorch152623.log", "torch_last_work", 0,
     {"rank": 0, "pg": "0", "failed_seq": 241, "last_enqueued": 315, "last_completed": 183}, 1),
    ("torch_frtrace_output_tutorial_missing_rank.log", "fr_missing_ranks", 0,
     {"seq": 5, "entry": 4, "group_info": "0:default_pg", "collective": "nccl:all_reduce",
      "missing_ranks": [1], "input_sizes": [[3, 4]], "expected_ranks": 2,
      "collective_state": "scheduled"}, 1),
    ("torch_heartbeat_monitor_stuck_deim105.log", "heartbeat_timeout", 1,
     {"rank": 0, "pg": "0", "work_meta_list_size": 84}, 3),
    ("torch_heartbeat_monitor_stuck_deim105.log", "heartbeat_stuck", 0,
     {"rank": 1, "seconds": 600}, 1),
    ("torch_pgwrapper_mismatch_shape_msswift9443.log", "collective_mismatch", 0,
     {"ranks": [1, 0], "seq": 3104, "detail": "Tensor Tensor shapes: 195812480vs 51123456"}, 1),
    ("torch_watchdog_timeout_allreduce_llamafactory7396.log", "torch_watchdog_timeout", 1,
     {"rank": 4, "seq": 1580, "op_type": "ALLREDUCE", "numel_in": 466119168,
      "timeout_ms": 600000}, 3),
    ("torch_watchdog_timeout_allreduce_llamafactory7396.log", "torch_last_work", 1,
     {"rank": 3, "pg": "1", "failed_seq": 1580, "last_enqueued": 1582, "last_completed": 1579},
     2),
    ("torch_watchdog_timeout_old_noseq_accelerate157.log", "torch_watchdog_timeout", 1,
     {"rank": 1, "seq": None, "op_type": "BROADCAST", "timeout_ms": 1800000}, 6),
    ("torch_watchdog_timeout_pgguid_basicsr737.log", "torch_last_work", 0,
     {"rank": 1, "pg": "0", "failed_seq": 808, "last_enqueued": 811, "last_completed": 807}, 2),
    ("torch_watchdog_timeout_ray_actor_prefix_openrlhf624.log", "torch_watchdog_timeout", 0,
     {"rank": 0, "seq": 17284, "op_type": "_ALLGATHER_BASE", "numel_in": 415236096,
      "numel_out": 1245708288, "timeout_ms": 7200000, "actor": "ReferenceModelRayActor",
      "actor_pid": 5823, "ip": "10.164.227.153", "repeated": 14}, 1),
    ("torch_watchdog_timeout_ray_actor_prefix_openrlhf624.log", "torch_last_work", 1,
     {"failed_seq": 17284, "last_enqueued": 17290, "last_completed": 17283}, 2),
]


@pytest.mark.parametrize("name,kind,index,expected,count", CASES,
                         ids=[f"{c[0].split('.')[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_fixture_facts(name: str, kind: str, index: int, expected: dict[str, Any],
                       count: int) -> None:
    evs = events(name, kind)
    assert len(evs) == count
    assert sub(evs[index], list(expected)) == expected


def test_desync_snapshot_groups() -> None:
    (ev,) = events("torch_desync_debug_report_pytorch152623.log", "desync_report")
    assert ev["snapshot"]["#317 started"] == [{"ranks": [3, 4, 5, 6],
                                               "state": "started _ALLGATHER_BASE"}]


def test_fr_dump_text_yields_no_log_events() -> None:
    assert events("torch_fr_dump_unpickled_tutorial_v2.5.txt") == []


def test_watchdog_old_format_shows_the_op_type_split() -> None:
    ops = {e["rank"]: e["op_type"]
           for e in events("torch_watchdog_timeout_old_noseq_accelerate157.log",
                           "torch_watchdog_timeout")}
    assert ops == {0: "ALLREDUCE", 1: "BROADCAST", 2: "BROADCAST", 3: "BROADCAST",
                   4: "BROADCAST", 7: "BROADCAST"}


@pytest.mark.parametrize("line,payload,meta", [
    ("\x1b[36m(RayTrainWorker pid=12, ip=10.0.0.2)\x1b[0m [rank3]:hello", "hello",
     {"actor": "RayTrainWorker", "actor_pid": 12, "ip": "10.0.0.2", "launcher_rank": 3}),
    ("[36m(W pid=7) x [repeated 3x across cluster]", "x",
     {"actor": "W", "actor_pid": 7, "repeated": 3}),
    ("[1,3]<stderr>:host:1:2 [0] NCCL INFO x", "host:1:2 [0] NCCL INFO x", {"launcher_rank": 3}),
    ("2024-05-01 10:00:00.123: [rank2]: boom", "boom", {"launcher_rank": 2}),
    ("[123] [rank0]:[E1 x] y", "[E1 x] y", {"launcher_rank": 0}),
])
def test_strip_prefixes(line: str, payload: str, meta: dict[str, Any]) -> None:
    assert strip_prefixes(line) == (payload, meta)


def test_merged_writers_are_split() -> None:
    line = ("gpu1:1:2 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x2 count 4 "
            "datatype 7 op 0 root 0 comm 0x3 [nranks=2] stream 0x4 node-b:3:4 [1] NCCL WARN "
            "Cuda failure 'out of memory'")
    assert len(split_records(line)) == 2
    evs = [e.to_dict() for e in parse_lines([line])]
    assert [(e["kind"], e["host"]) for e in evs] == [("nccl_coll", "gpu1"),
                                                    ("nccl_warn", "node-b")]
    assert evs[1]["category"] == "cuda_error"


def test_newer_init_line_with_comm_id() -> None:
    line = ("node-a:100:200 [3] NCCL INFO ncclCommInitRank comm 0x55d0 rank 3 nranks 8 "
            "cudaDev 3 nvmlDev 3 busId 3b000 commId 0x9e5d2c0f1a - Init COMPLETE")
    (ev,) = [e.to_dict() for e in parse_lines([line])]
    assert sub(ev, ["kind", "host", "pid", "rank", "nranks", "cuda_dev", "comm_id"]) == {
        "kind": "nccl_init", "host": "node-a", "pid": 100, "rank": 3, "nranks": 8,
        "cuda_dev": 3, "comm_id": "0x9e5d2c0f1a"}


def test_garbage_never_raises() -> None:
    junk = ["", "\x00\x01", "[", "NCCL INFO", ":::: [x] NCCL WARN", "[rank]:", "#0-0 (zz) MISMATCH",
            "Not all ranks joining collective 9 at entry 1", "   - [0] Timeout at collective: X, #1"]
    parse_lines(junk)


def test_errors_by_rank_for_the_analyzer() -> None:
    evs = parse_text((FIXTURES / "torch_watchdog_timeout_pgguid_basicsr737.log").read_text())
    errs = errors_by_rank(evs)
    assert sorted(errs) == [0, 1, 2]
    assert "torch_watchdog_timeout" in errs[1][0]
