"""Fault injection from the spec's ``inject_fault: {kind, rank, step}`` block (tests, demos).

The loop calls :meth:`FaultInjector.before_step` at the start of every step (phase ``data``)
and :meth:`FaultInjector.before_collective` just before its own collective (the all-reduce of
the loss, phase ``optimizer``, workers/loop/stepsync.py), which every rank runs at a fault's step
(:meth:`FaultInjector.in_step_collective`) even between its regular sync steps; the
pipeline runner calls :meth:`FaultInjector.maybe_p2p_stall` just before a stage sends its
activations. What each kind looks like to the hang watchdog (heartbeats + Flight Recorder):

* ``hang`` — rank R blocks forever (in ``_hang_before_collective``) at step S before the loss
  all-reduce. Its heartbeat keeps coming with phase ``optimizer`` and, for the default group,
  ``last_enqueued`` one lower than its peers; the peers show that collective enqueued and not
  completed, then fail with the collective timeout. Verdict: a rank that never joined.
* ``crash`` — rank R calls ``os._exit(CRASH_EXIT_CODE)`` at the start of step S: heartbeats
  stop, the process is gone, peers time out in their next collective. Verdict: RANK_EXITED.
* ``mismatch`` — rank R calls the loss all-reduce with MISMATCH_NUMEL elements instead of 2 at
  step S: every rank has the same seq enqueued but the sizes differ (Flight Recorder entries
  show both sizes). gloo aborts the rank with the smaller buffer (SIGABRT) at once, so
  evidence must be taken at or before the call; NCCL would hang or corrupt memory instead.
  Verdict: COLLECTIVE_MISMATCH.
* ``desync`` — rank R skips the loss all-reduce at step S: from then on its seq numbers lag
  its peers by one and its next collective (a gradient all-reduce / reduce-scatter) pairs with
  their loss all-reduce. Verdict: COLLECTIVE_MISMATCH (seq / op mismatch).
* ``slow`` — rank R sleeps ``seconds`` at the start of every step from S on: all ranks make
  progress but each step takes longer, and R is the one whose phase sits in ``data`` while
  the others wait in a collective. Verdict: STRAGGLER.
* ``user_hang`` — every rank blocks at step S in plain Python (``_user_code_blocks_forever``)
  outside any collective: heartbeats continue, phase ``data``, no collective enqueued and not
  completed on any rank, no timeout ever fires. Verdict: NON_COLLECTIVE_HANG.
* ``nic_hang`` — like ``hang``, but rank R first writes an NCCL ``NET/IB`` completion error
  (the line NCCL's IB plugin prints when a NIC fails, ``NIC_ERROR_LINE``) to its stderr, which
  the evidence round reads as that rank's NCCL errors: a hang with hardware evidence on one
  node. Verdict: a rank that never joined, whose node the health policy cordons.
* ``slow_send`` — rank R's pre-flight sends start ``seconds`` late (every attempt it fires
  in): its receiver's p2p timing is far below its peers', so the pre-flight check fails the
  attempt before step 1 naming R, and R's node is cordoned and routed around.
* ``slow_save`` — rank R sleeps ``seconds`` in the checkpoint phase after step S, before
  the save (a large model on a slow filesystem): the heartbeat's phase is ``checkpoint``, and
  at a save step its peers wait for it inside the save's collectives. Not a hang: the
  watchdog holds a save to ``watchdog.checkpoint_timeout_s``, not to the stall threshold.
* ``p2p_stall`` — pipeline stage rank R never sends at step S (blocks in
  ``_p2p_stall_forever``); its peer waits in recv. Verdict: P2P_MISMATCH.

The block only fires in attempt ``inject_fault.attempt`` (null: every attempt), so a restart
from a checkpoint can succeed.
"""

from __future__ import annotations

import os
import sys
import time
from enum import StrEnum

from orchestrator.spec import FaultKind, InjectFault, JobSpec

CRASH_EXIT_CODE = 43
# Elements the mismatching rank all-reduces instead of 2. A large difference makes gloo detect
# it (the smaller side aborts with SIGABRT); 3 vs 2 would silently pair up and hang instead.
MISMATCH_NUMEL = 4096


class CollectiveAction(StrEnum):
    RUN = "run"
    SKIP = "skip"
    MISMATCH = "mismatch"


def _block_forever(reason: str) -> None:
    # A plain sleep loop: no lock, no collective, visible in a Python stack dump by the
    # caller's function name.
    print(f"[meshyard fault] {reason}", file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)


def _hang_before_collective(step: int) -> None:
    _block_forever(f"hang: blocking forever before the step {step} collective")


# The IB plugin's completion error as NCCL 2.2x prints it (hostname:pid:tid [dev] file:line).
NIC_ERROR_LINE = ("{host}:{pid}:{pid} [0] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion "
                  "from peer 10.0.0.2<44206> with status=12 opcode=129 len=65536 vendor err 129 "
                  "(Recv) (injected by meshyard fault nic_hang)")


def _nic_error_then_hang(step: int) -> None:
    import socket

    print(NIC_ERROR_LINE.format(host=socket.gethostname(), pid=os.getpid()), file=sys.stderr,
          flush=True)
    _block_forever(f"nic_hang: blocking forever before the step {step} collective")


def _user_code_blocks_forever(step: int) -> None:
    _block_forever(f"user_hang: blocking forever in user code at step {step}")


def _p2p_stall_forever(step: int) -> None:
    _block_forever(f"p2p_stall: stage never sends at step {step}")


class FaultInjector:
    """Decides, per rank, whether and how to misbehave. Inert when the spec has no fault."""

    def __init__(self, fault: InjectFault | None, *, rank: int, attempt: int = 1) -> None:
        active = fault is not None and (fault.attempt is None or fault.attempt == attempt)
        self.fault = fault if active else None
        self.rank = rank

    @classmethod
    def from_spec(cls, spec: JobSpec, *, rank: int, attempt: int = 1) -> FaultInjector:
        return cls(spec.inject_fault, rank=rank, attempt=attempt)

    def _is(self, kind: FaultKind, step: int, *, any_rank: bool = False) -> bool:
        f = self.fault
        return (f is not None and f.kind == kind and step == f.step
                and (any_rank or f.rank == self.rank))

    def in_step_collective(self, step: int) -> bool:
        """Whether the loop's collective is where this fault strikes at ``step`` (on any rank:
        every rank must then run that collective)."""
        f = self.fault
        return (f is not None and step == f.step
                and f.kind in (FaultKind.HANG, FaultKind.NIC_HANG, FaultKind.DESYNC,
                               FaultKind.MISMATCH))

    def before_step(self, step: int) -> None:
        f = self.fault
        if f is None:
            return
        if f.kind == FaultKind.SLOW and f.rank == self.rank and step >= f.step:
            time.sleep(f.seconds)
        elif self._is(FaultKind.CRASH, step):
            print(f"[meshyard fault] crash: rank {self.rank} exits at step {step}",
                  file=sys.stderr, flush=True)
            os._exit(CRASH_EXIT_CODE)
        elif self._is(FaultKind.USER_HANG, step, any_rank=True):
            _user_code_blocks_forever(step)

    def before_collective(self, step: int) -> CollectiveAction:
        if self._is(FaultKind.HANG, step):
            _hang_before_collective(step)
        if self._is(FaultKind.NIC_HANG, step):
            _nic_error_then_hang(step)
        if self._is(FaultKind.DESYNC, step):
            print(f"[meshyard fault] desync: rank {self.rank} skips the step {step} collective",
                  file=sys.stderr, flush=True)
            return CollectiveAction.SKIP
        if self._is(FaultKind.MISMATCH, step):
            print(f"[meshyard fault] mismatch: rank {self.rank} all-reduces a different size "
                  f"at step {step}", file=sys.stderr, flush=True)
            return CollectiveAction.MISMATCH
        return CollectiveAction.RUN

    def before_checkpoint(self, step: int) -> None:
        """Checkpoint hook: called after step ``step``, in the checkpoint phase."""
        f = self.fault
        if f is not None and self._is(FaultKind.SLOW_SAVE, step):
            print(f"[meshyard fault] slow_save: rank {self.rank} saves {f.seconds:g} s late "
                  f"after step {step}", file=sys.stderr, flush=True)
            time.sleep(f.seconds)

    def before_send(self) -> None:
        """Pre-flight hook: called just before this rank posts a send."""
        f = self.fault
        if f is not None and f.kind == FaultKind.SLOW_SEND and f.rank == self.rank:
            time.sleep(f.seconds)

    def maybe_p2p_stall(self, step: int) -> None:
        """Pipeline hook: call just before this stage sends at ``step``."""
        if self._is(FaultKind.P2P_STALL, step):
            _p2p_stall_forever(step)
