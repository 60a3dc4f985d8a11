"""Recommendations per verdict, in the troubleshooting order of the design documents:
same collective order on every rank, world size and rank setup, device binding by local rank,
NIC / IB configuration, early exits, NCCL_DEBUG=INFO, an isolated collective test. Only those
the job's own evidence leaves open are given (`JobFacts`).

Pure module.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.watchdog.report import Verdict

_ORDER = ("Check that every rank issues the same collectives in the same order: look for "
          "rank-dependent branches (if rank == 0 ...), data-dependent loops, uneven batches or "
          "early `break`s around the culprit's stack.")
_SETUP = ("Check the world size and rank setup: every rank must create the same process groups "
          "in the same order with the same member lists.")
_DEVICE = ("Check device binding: each rank must use the GPU of its LOCAL rank "
           "(torch.cuda.set_device(local_rank)) before creating the process group.")
_NIC = ("Check the NIC / InfiniBand configuration of the suspect node(s): link state "
        "(ibstat), NCCL_IB_HCA / NCCL_SOCKET_IFNAME, GPU-NIC affinity, recent link errors.")
_EXIT = ("Look for early exits: the exited rank's exit code, its last log lines and "
         "stderr (OOM kill, exception, sys.exit) explain why its peers are waiting.")
_CRASH = ("Read the exited rank's error and traceback first: its peers' errors (connection "
          "closed, timeouts) are what its exit did to them.")
_DEBUG = ("Re-run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL,NET and "
          "TORCH_DISTRIBUTED_DEBUG=DETAIL to see every collective's arguments per rank.")
_DEBUG_CPU = ("Re-run with TORCH_DISTRIBUTED_DEBUG=DETAIL to see every collective's arguments "
              "per rank.")
_ISOLATE = ("Run an isolated collective test (nccl-tests all_reduce_perf, or a 2-rank "
            "torch.distributed all_reduce) on the suspect nodes/GPUs to separate hardware from "
            "program bugs.")
_SHAPES = ("Compare the tensor shapes and dtypes passed at the mismatched collective: a rank "
           "with a different model config, padding or bucket layout sends a different size.")
_P2P = ("Check the pipeline schedule: every send must have a matching recv on the peer "
        "(same order, same shapes); a stage that skips or reorders a send/recv deadlocks.")
_STACK = ("Read the stacks below: every rank is blocked outside torch.distributed (data loader, "
          "lock, I/O, a barrier of your own); the common frame is where to look.")
_STRAGGLER = ("Profile the slow rank: data loading, CPU contention, extra work only it does "
              "(logging, evaluation), thermal throttling or a slower device.")

# Per verdict, in order; the `_when` table below drops what this job's evidence rules out.
RECOMMENDATIONS: dict[Verdict, tuple[str, ...]] = {
    Verdict.NOT_JOINED: (_ORDER, _SETUP, _DEVICE, _EXIT, _DEBUG),
    Verdict.RANK_EXITED: (_CRASH, _EXIT, _ORDER, _SETUP, _DEBUG),
    Verdict.COLLECTIVE_MISMATCH: (_SHAPES, _ORDER, _SETUP, _DEBUG),
    Verdict.P2P_MISMATCH: (_P2P, _ORDER, _SETUP, _DEBUG),
    Verdict.COMM_WEDGED: (_DEVICE, _NIC, _DEBUG, _ISOLATE),
    Verdict.NON_COLLECTIVE_HANG: (_STACK, _ORDER, _EXIT),
    Verdict.STRAGGLER: (_STRAGGLER, _NIC, _ISOLATE),
    Verdict.UNKNOWN: (_ORDER, _SETUP, _DEVICE, _NIC, _EXIT, _DEBUG, _ISOLATE),
}


@dataclass(frozen=True)
class JobFacts:
    """What the evidence of one job says, which decides which advice applies. The defaults
    (nothing known) keep every recommendation of the verdict."""

    gpus: bool | None = None  # the ranks run on GPUs (None: unknown)
    exited: bool | None = None  # some rank's process ended
    crashed: bool = False  # a rank ended of its own error (not of a peer's)
    multi_node: bool | None = None  # the ranks span more than one node
    suspect_hardware: bool = False  # the analysis named suspect hardware
    network_errors: bool = False  # the ranks' logs carry NIC / socket errors


def _applies(text: str, f: JobFacts) -> bool:
    if text == _DEVICE:
        return f.gpus is not False
    if text == _DEBUG:
        return f.gpus is not False
    if text == _DEBUG_CPU:
        return f.gpus is False
    if text == _EXIT:
        return f.exited is not False
    if text == _CRASH:
        return f.crashed
    if text == _NIC:
        return f.network_errors or f.suspect_hardware or (
            f.gpus is not False and f.multi_node is not False)
    if text == _ISOLATE:
        return f.suspect_hardware or f.network_errors
    return True


def recommendations(verdict: Verdict, facts: JobFacts | None = None) -> tuple[str, ...]:
    """The verdict's recommendations that this job's evidence does not rule out: no GPU
    binding advice on a CPU job, no "the exited rank" when none exited, no NIC advice for
    ranks on one node without network errors.

    >>> cpu = recommendations(Verdict.NOT_JOINED, JobFacts(gpus=False, exited=False))
    >>> [t.split(":")[0][:40] for t in cpu]  # no device binding, exited rank nor NCCL_DEBUG
    ['Check that every rank issues the same co', 'Check the world size and rank setup', \
'Re-run with TORCH_DISTRIBUTED_DEBUG=DETA']
    """
    f = facts or JobFacts()
    base = RECOMMENDATIONS.get(verdict, RECOMMENDATIONS[Verdict.UNKNOWN])
    if f.gpus is False:
        base = tuple(_DEBUG_CPU if t == _DEBUG else t for t in base)
    return tuple(t for t in base if _applies(t, f))


def ranks_text(ranks: tuple[int, ...] | list[int], limit: int = 8) -> str:
    """'Rank 5' / 'Ranks 1, 3' / 'Ranks 0, 1, ... (12 ranks)'."""
    rs = sorted(ranks)
    if len(rs) == 1:
        return f"Rank {rs[0]}"
    shown = ", ".join(map(str, rs[:limit]))
    return f"Ranks {shown}" + (f", ... ({len(rs)} ranks)" if len(rs) > limit else "")
