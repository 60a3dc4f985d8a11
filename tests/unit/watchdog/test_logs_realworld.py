"""Log shapes met in the first week (tests/fixtures/logs_realworld/): launcher and shipper
prefixes in any chain, cut messages, torchrun's failure summary. Each case names the facts
a line must yield; the prefix's rank is kept where it has one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.watchdog.log_prefixes import rank_in_prefix, strip_decorations
from orchestrator.watchdog.logs import errors_by_rank, parse_lines, parse_text
from tests.unit.watchdog.test_logs import sub

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "logs_realworld"


def events(name: str, kind: str | None = None) -> list[dict[str, Any]]:
    out = [e.to_dict() for e in parse_text((FIX / name).read_text())]
    return [e for e in out if kind is None or e["kind"] == kind]


# (file, kind, index, expected subset of fields, count of that kind)
CASES: list[tuple[str, str, int, dict[str, Any], int]] = [
    ("mpirun_timestamp_tag_output.log", "nccl_init", 1,
     {"launcher_rank": 9, "rank": 9, "nranks": 16, "host": "bert-mpi-training-worker-1"}, 2),
    ("mpirun_timestamp_tag_output.log", "nccl_channel", 0,
     {"launcher_rank": 9, "src": 9, "dst": 10, "transport": "P2P"}, 1),
    ("mpirun_timestamp_tag_output.log", "nccl_warn", 0,
     {"launcher_rank": 3, "cuda_dev": 3, "category": "ib_completion_error", "ib_status": 12,
      "vendor_err": 129}, 1),
    ("mpirun_timestamp_tag_output.log", "torch_watchdog_timeout", 0,
     {"launcher_rank": 3, "rank": 3, "seq": 1211, "op_type": "ALLREDUCE",
      "timeout_ms": 600000, "ran_ms": 600034}, 1),
    ("slurm_srun_label.log", "nccl_init", 1,
     {"launcher_rank": 11, "rank": 11, "host": "qgpu2017", "bus_id": "4b000"}, 2),
    ("slurm_srun_label.log", "nccl_net", 0,
     {"launcher_rank": 0, "transport": "IB", "devices": ["mlx5_0:1/IB", "mlx5_2:1/RoCE"]}, 2),
    ("slurm_srun_label.log", "torch_watchdog_timeout", 0,
     {"launcher_rank": 7, "rank": 7, "seq": 47, "op_type": "BROADCAST"}, 1),
    ("slurm_srun_label.log", "torch_last_work", 0,
     {"rank": 7, "pg": "0", "pg_desc": "default_pg", "failed_seq": 47, "last_enqueued": 47,
      "last_completed": 46}, 1),
    ("kubernetes_kubectl_timestamps_prefix.log", "nccl_net", 0,
     {"host": "trainer-node-0-0-x7k2p", "transport": "Socket",
      "devices": ["eth0:172.29.141.183"]}, 1),
    ("kubernetes_kubectl_timestamps_prefix.log", "nccl_version", 0,
     {"host": "trainer-node-1-0-q9d4m", "version": "2.27.6", "cuda": "12.9"}, 1),
    ("kubernetes_kubectl_timestamps_prefix.log", "nccl_warn", 0,
     {"tid": 1201, "source": "misc/socket.cc:50", "category": "connection_closed"}, 1),
    ("loki_logcli_default_output.log", "nccl_init", 0,
     {"host": "tj5-sc-ai-h800r-dev01", "rank": 0, "nranks": 4, "nvml_dev": 4}, 1),
    ("loki_logcli_default_output.log", "torch_watchdog_timeout", 0,
     {"rank": 2, "seq": 9, "op_type": "ALLGATHER", "numel_out": 16384}, 1),
    ("ray_nested_actor_prefixes.log", "nccl_init", 0,
     {"actor": "RayWorkerWrapper", "actor_pid": 285, "ip": "192.168.177.12", "host": "spark2",
      "rank": 1, "complete": True}, 1),
    ("ray_nested_actor_prefixes.log", "nccl_net", 0,
     {"actor": "RayTrainWorker", "actor_pid": 83498, "host": "localhost",
      "transport": "Socket"}, 1),
    ("ray_nested_actor_prefixes.log", "nccl_bootstrap", 0,
     {"actor_pid": 34272, "host": "gpu-node-3", "interface": "eth0"}, 1),
    ("ray_nested_actor_prefixes.log", "torch_watchdog_timeout", 0,
     {"actor": "RayTrainWorker", "ip": "10.148.18.25", "repeated": 3, "rank": 1,
      "seq": 6463}, 1),
    ("unknown_prefix_chains.log", "nccl_net", 0, {"host": "hostname", "pid": 822689}, 2),
    ("unknown_prefix_chains.log", "nccl_channel", 0,
     {"host": "unicom-169", "src": 5, "dst": 4, "launcher_rank": None}, 2),
    ("unknown_prefix_chains.log", "nccl_channel", 1,
     {"launcher_rank": 6, "src": 6, "dst": 7, "transport": "P2P"}, 2),
    ("unknown_prefix_chains.log", "torch_watchdog_timeout", 0,
     {"rank": 1, "seq": 6463, "timeout_ms": 1800000}, 1),
    ("truncated_messages.log", "collective_mismatch", 0,
     {"ranks": [1, 0], "seq": 3104, "partial": True, "cut": "ranks", "detail": None,
      "fingerprints": {"1": {"op_type": "ALLREDUCE", "shape": "[195812480]",
                             "dtypes": "BFloat16"}, "0": {}}}, 4),
    ("truncated_messages.log", "collective_mismatch", 1,
     {"ranks": [3, 2], "seq": 77, "partial": True,
      "fingerprints": {"3": {"op_type": "ALLGATHER", "shape": "[4096]", "dtypes": "Float"},
                       "2": {"op_type": None, "shape": None, "dtypes": None,
                             "partial": True}}}, 4),
    ("truncated_messages.log", "collective_mismatch", 2,
     {"ranks": [0], "partial": None,
      "fingerprints": {"0": {"op_type": "BROADCAST", "shape": "[34112]", "dtypes": "Float"}}},
     4),
    ("truncated_messages.log", "collective_mismatch", 3,
     {"ranks": [0, 1], "partial": None,
      "fingerprints": {"0": {"op_type": "ALLREDUCE", "shape": "[20, 10]", "dtypes": "Float"},
                       "1": {"op_type": "REDUCE", "shape": None, "dtypes": None}}}, 4),
    ("truncated_messages.log", "torch_watchdog_timeout", 0,
     {"rank": 5, "seq": 1580, "op_type": "ALLREDUCE", "numel_in": 4661, "timeout_ms": None,
      "partial": True, "cut": "numel_in"}, 1),
    ("truncated_messages.log", "torch_last_work", 0,
     {"rank": 6, "pg": "1", "failed_seq": 1580, "last_enqueued": 1582, "last_completed": None,
      "partial": True, "cut": "last_enqueued"}, 1),
    ("truncated_messages.log", "heartbeat_timeout", 0,
     {"rank": 2, "pg_desc": "default_pg", "work_meta_list_size": None, "partial": True}, 1),
    ("truncated_messages.log", "gloo_timeout", 0,
     {"rank": 6, "op": "recv", "timeout_ms": 1800000, "source": "unbound_buffer.cc:81",
      "partial": True}, 1),
    ("torchrun_failure_signal_and_traceback.log", "rank_exited", 0,
     {"rank": 1, "local_rank": 1, "host": "gpu-a100-07.cluster.local", "exit_code": -6,
      "pid": 5938, "signal": "SIGABRT", "error_file": None, "root_cause": False,
      "time": "2024-05-08_08:47:33", "exception": "Signal 6 (SIGABRT) received by PID 5938"},
     2),
    ("torchrun_failure_signal_and_traceback.log", "rank_exited", 1,
     {"rank": 2, "local_rank": 2, "exit_code": 1, "signal": None, "root_cause": True,
      "error_file": "/tmp/torchelastic_w1k2/none_8xq1/attempt_0/2/error.json",
      "exception": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                   "GPU 2 has a total capacity of 79.15 GiB of which 1.02 GiB is free.",
      "partial": None}, 2),
    ("torchrun_failure_no_other_failures_slurm.log", "rank_exited", 0,
     {"rank": 13, "local_rank": 5, "host": "node-b", "exit_code": 1, "traceback": None,
      "root_cause": True, "partial": None}, 2),
    ("torchrun_failure_no_other_failures_slurm.log", "rank_exited", 1,
     {"rank": 2, "host": "node-a", "exit_code": -6, "pid": 129911, "error_file": None,
      "partial": True}, 2),
]


def test_every_fixture_is_covered() -> None:
    covered = {name for name, *_ in CASES}
    assert covered == {p.name for p in FIX.glob("*.log")}


@pytest.mark.parametrize("name,kind,index,expected,count", CASES,
                         ids=[f"{c[0].split('.')[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_fixture_facts(name: str, kind: str, index: int, expected: dict[str, Any],
                       count: int) -> None:
    evs = events(name, kind)
    assert len(evs) == count
    assert sub(evs[index], list(expected)) == expected


def test_root_cause_traceback_is_the_error_files_call_stack() -> None:
    ev = events("torchrun_failure_signal_and_traceback.log", "rank_exited")[1]
    assert ev["traceback"].splitlines()[:3] == [
        "Traceback (most recent call last):",
        '  File "/home/ubuntu/Salience-DETR/main.py", line 211, in <module>',
        "    train()"]


def test_torch_quoting_nccl_version_is_no_version_line() -> None:
    evs = events("kubernetes_kubectl_timestamps_prefix.log", "nccl_version")
    assert [e["line"] for e in evs] == [4]  # line 7 quotes "NCCL version 2.27.6" in an error


@pytest.mark.parametrize("line,payload,meta", [
    ("Thu May  7 10:39:20 2020[1,1]<stdout>:host:1:2 [0] NCCL INFO x",
     "host:1:2 [0] NCCL INFO x", {"launcher_rank": 1}),
    (" 3: host:1:2 [0] NCCL INFO x", "host:1:2 [0] NCCL INFO x", {"launcher_rank": 3}),
    ("[pod/w-0/c] 2024-05-01T10:00:00.123456789Z 12: [rank5]:boom", "boom",
     {"launcher_rank": 5}),
    ('2018-06-25T12:52:09Z {job="a", pod="b"} (pid=7) x', "x", {"actor_pid": 7}),
    ("May  7 10:39:20 node-a python[12]: [2024-05-01 10:00:00,123] x", "x", {}),
    ("0:   time      : 2024", "  time      : 2024", {"launcher_rank": 0}),
])
def test_prefix_chains(line: str, payload: str, meta: dict[str, Any]) -> None:
    assert strip_decorations(line) == (payload, meta)


def test_rank_in_unrecognised_text() -> None:
    assert rank_in_prefix("<14>1 2024 node - - [1,6]<stdout>: ") == 6
    assert rank_in_prefix("shipper | [rank2]: ") == 2
    assert rank_in_prefix("worker 5 | 10:39:20 ") is None


def test_the_prefix_rank_does_not_override_the_lines_own() -> None:
    (ev,) = parse_lines(["x | [1,4]<stdout>: [rank7]:[E1 x] [Rank 7] Watchdog caught collective "
                         "operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, "
                         "Timeout(ms)=60000)"])
    assert (ev.get("rank"), ev.get("seq"), ev.get("partial")) == (7, 3, None)


def test_rank_exited_counts_as_an_error_of_its_rank() -> None:
    evs = parse_text((FIX / "torchrun_failure_signal_and_traceback.log").read_text())
    errs = errors_by_rank(evs)
    assert sorted(errs) == [1, 2]
    assert "exit_code=1" in errs[2][0]


def test_console_script_logs_parse_json() -> None:
    import json
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "meshyard"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from api.cli import main; main()"]
    out = subprocess.run([*cmd, "logs", "parse", str(FIX / "slurm_srun_label.log"), "--json"],
                         capture_output=True, text=True, check=True, timeout=120)
    evs = json.loads(out.stdout)
    assert [(e["kind"], e.get("launcher_rank")) for e in evs] == [
        ("nccl_net", 0), ("nccl_init", 0), ("nccl_init", 11), ("nccl_net", 11),
        ("torch_watchdog_timeout", 7), ("torch_last_work", 7)]
