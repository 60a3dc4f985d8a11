"""Recommendations per verdict, in the troubleshooting order of the design documents:
same collective order on every rank, world size and rank setup, device binding by local rank,
NIC / IB configuration, early exits, NCCL_DEBUG=INFO, an isolated collective test.

Pure module.
"""

from __future__ import annotations

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
_DEBUG = ("Re-run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL,NET and "
          "TORCH_DISTRIBUTED_DEBUG=DETAIL to see every collective's arguments per rank.")
_ISOLATE = ("Run an isolated collective test (nccl-tests all_reduce_perf, or a 2-rank "
            "torch.distributed all_reduce) on the suspect nodes/GPUs to separate hardware from "
            "program bugs.")
_SHAPES = ("Compare the tensor shapes and dtypes passed at the mismatched collective: a rank "
           "with a different model config, padding or bucket layout sends a different size.")
_P2P = ("Check the pipeline schedule: every send must have a matching recv on the peer "
        "(same order, same shapes); a stage that skips or reorders a send/recv deadlocks.")
_STACK = ("Read the stacks below: every rank is blocked outside torch.distributed (data loader, "
          "lock, I/O, a barrier of your own); the common frame is where to look.")
_STRAGGLER = ("Profile the slow rank: data loading, CPU contention, thermal throttling or a "
              "slower GPU/NIC; consider excluding its node if it persists.")

RECOMMENDATIONS: dict[Verdict, tuple[str, ...]] = {
    Verdict.NOT_JOINED: (_ORDER, _SETUP, _DEVICE, _EXIT, _DEBUG),
    Verdict.RANK_EXITED: (_EXIT, _ORDER, _SETUP, _DEBUG),
    Verdict.COLLECTIVE_MISMATCH: (_SHAPES, _ORDER, _SETUP, _DEBUG),
    Verdict.P2P_MISMATCH: (_P2P, _ORDER, _SETUP, _DEBUG),
    Verdict.COMM_WEDGED: (_DEVICE, _NIC, _DEBUG, _ISOLATE),
    Verdict.NON_COLLECTIVE_HANG: (_STACK, _ORDER, _EXIT),
    Verdict.STRAGGLER: (_STRAGGLER, _NIC, _ISOLATE),
    Verdict.UNKNOWN: (_ORDER, _SETUP, _DEVICE, _NIC, _EXIT, _DEBUG, _ISOLATE),
}


def recommendations(verdict: Verdict) -> tuple[str, ...]:
    return RECOMMENDATIONS.get(verdict, RECOMMENDATIONS[Verdict.UNKNOWN])


def ranks_text(ranks: tuple[int, ...] | list[int], limit: int = 8) -> str:
    """'Rank 5' / 'Ranks 1, 3' / 'Ranks 0, 1, ... (12 ranks)'."""
    rs = sorted(ranks)
    if len(rs) == 1:
        return f"Rank {rs[0]}"
    shown = ", ".join(map(str, rs[:limit]))
    return f"Ranks {shown}" + (f", ... ({len(rs)} ranks)" if len(rs) > limit else "")
