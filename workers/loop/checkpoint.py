"""Distributed checkpoints with torch.distributed.checkpoint (DCP).

Layout: ``<checkpoint_dir>/step_00000010/`` holds the DCP files; rank 0 writes
``COMPLETE`` (JSON with the step; written whole or not at all) once every rank's part is on
disk, and only complete checkpoints are resumed from or counted for ``keep``. A save that
fails (a full disk, a storage that went away) raises `CheckpointSaveError`, which names the
step, the host, the path and the cause, and leaves its folder without a marker: a restart
resumes from the newest complete checkpoint before it. State is saved through
``get_state_dict`` / ``set_state_dict``, keyed by parameter FQN, so a checkpoint saved under
DDP loads under FSDP / TP (DCP reshards), and a resumed run continues the same trajectory
(the data stream is a pure function of the step).

Async saves (``dcp.async_save``, a background thread) are used when the spec asks for them;
the previous save is awaited before the next one starts and at the end of training.
ZeRO-1 (``ZeroRedundancyOptimizer``) keeps its state outside DCP's reach: its optimizer state
is consolidated on rank 0 and saved with torch.save next to the DCP files.

Each rank's RNG state (CPU, and CUDA when in use) goes into ``rng/rank_<r>.pt``, written
before the rank's part counts as on disk, and is restored on resume: dropout masks after a
restart are the ones the uninterrupted run would have drawn. A resume on more ranks than
saved leaves the new ranks' RNG as seeded.

A DDP comm hook's state (Top-K residuals, PowerSGD's error feedback and memories, see
`workers.loop.compression`) goes into ``comm_hook/rank_<r>.pt`` the same way and is restored when
the resumed run uses the same hook.

Expert-parallel ranks hold different experts under the same names; their weights and Adam
moments are saved as DTensors of the full expert set over the ep mesh
(`workers.loop.moe.ExpertShards`), so DCP writes each expert once and a checkpoint loads under
any ep degree (ep = 1 included) that divides the experts.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from meshyard._protocol import MARKER, complete_checkpoints
from orchestrator.spec import JobSpec
from workers.loop.compression import hook_state
from workers.loop.moe import ExpertShards

# Optimizer param_groups keyed by parameter FQN, not by group index: pipeline ranks hold
# different parameters, and index-keyed groups ("param_groups.0.params") collide across
# ranks in DCP's dedup, so a pp rank would load another stage's group.
_OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
ZERO1_FILE = "zero1_optim.pt"
RNG_DIR = "rng"
HOOK_DIR = "comm_hook"


def _rng_state() -> dict[str, torch.Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _rng_file(step_dir: Path, rank: int) -> Path:
    return step_dir / RNG_DIR / f"rank_{rank}.pt"


def _hook_file(step_dir: Path, rank: int) -> Path:
    return step_dir / HOOK_DIR / f"rank_{rank}.pt"


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def complete_steps(root: str | Path) -> list[int]:
    """Steps with a complete checkpoint under ``root``, ascending (a marker that does not
    read as one does not count)."""
    return [step for step, _ in complete_checkpoints(root)]


class CheckpointSaveError(RuntimeError):
    """A checkpoint was not saved; the message names the step, host, path and cause."""


def _save_error(exc: BaseException, *, step: int, root: Path, rank: int,
                store_uri: str | None = None) -> CheckpointSaveError:
    cause, failed_on = exc, None
    if isinstance(exc, CheckpointException) and exc.failures:  # every rank's, gathered
        if rank in exc.failures:
            cause = exc.failures[rank][0]
        else:  # this rank wrote its part; a peer's write failed the save
            failed_on = min(exc.failures)
            cause = exc.failures[failed_on][0]
    where = getattr(cause, "filename", None) or _step_dir(root, step)
    text = (cause.strerror if isinstance(cause, OSError) and cause.strerror
            else f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1][:300]}")
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None
    if free is not None and free < (1 << 20) and os.strerror(errno.ENOSPC) not in text:
        # torch's own writer reports a full disk as a failed write at some position
        text = f"{os.strerror(errno.ENOSPC)}: {free} bytes free there ({text})"
    newest = complete_steps(root)
    if store_uri is not None:  # this host's disk is a copy: the store says what is complete
        after = f"a restart resumes from the newest checkpoint complete in {store_uri}"
    elif newest:
        after = f"a restart resumes from step {newest[-1]}, the newest complete checkpoint"
    else:
        after = "no complete checkpoint is kept: a restart starts from step 0"
    # A peer's failure is said as one (exits.PEER_LOST): the failure summary leads with the
    # rank whose own write failed, on its own host.
    on = (f": it failed on peer rank {failed_on}" if failed_on is not None
          else f" on {socket.gethostname()}")
    return CheckpointSaveError(f"the checkpoint of step {step} was not saved{on}: {text} "
                               f"({where}); {after}")


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _size_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class Checkpointer:
    """`on_saved(info)` is called on rank 0 when a checkpoint is complete: step, path,
    size_bytes, time and `kept` (the steps still on disk after pruning). `store_uri`: the
    cluster's checkpoint store, which a failed save's message names."""

    def __init__(self, spec: JobSpec, *, root: str | Path, parts: list[nn.Module],
                 optimizer: torch.optim.Optimizer, rank: int,
                 on_saved: Callable[[dict[str, Any]], None] | None = None,
                 store_uri: str | None = None) -> None:
        self._cfg = spec.checkpoint
        self._store_uri = store_uri
        self._root = Path(root)
        if len(parts) != 1:
            # Pipeline ranks with several chunks expose one StageUnion module (full-model FQNs).
            raise ValueError(f"checkpointing expects one model module per rank, got {len(parts)}")
        self._model = parts[0]
        self._opt: Any = optimizer
        self._rank = rank
        self._on_saved = on_saved
        self._zero1 = type(optimizer).__name__ == "ZeroRedundancyOptimizer"
        self._pending: tuple[int, Any] | None = None
        self._last_saved = -1
        self.rng_restored = False
        self.hook_restored = False
        self._hook = hook_state(self._model)
        self._experts = ExpertShards(self._model)
        self._async = self._cfg.enabled and self._cfg.async_save and dist.is_initialized()
        # The async save's background thread runs collectives (plan / metadata exchange).
        # On the training group they would interleave with the main thread's gradient
        # all-reduces and deadlock, so async saves get their own gloo group.
        self._pg = dist.new_group(backend="gloo") if self._async else None

    # -- state ------------------------------------------------------------------------------
    @property
    def background_groups(self) -> frozenset[str]:
        """Flight Recorder names of the groups this checkpointer runs collectives on outside
        the training step (the async save's)."""
        return frozenset({self._pg.group_name}) if self._pg is not None else frozenset()

    def _state(self) -> dict[str, Any]:
        model = self._model
        if self._zero1:
            msd = get_state_dict(model, [])[0]
            return {"model": msd}
        msd, osd = get_state_dict(model, self._opt, options=_OPTIM_OPTIONS)
        return {"model": msd, "optim": osd}

    def _on_disk(self, state: dict[str, Any]) -> dict[str, Any]:
        """`state` as DCP writes and reads it: expert weights as the full expert set."""
        if not self._experts:
            return state
        return {k: self._experts.to_global(v) for k, v in state.items()}

    # -- save -------------------------------------------------------------------------------
    def maybe_save(self, step: int, *, final: bool = False) -> bool:
        if not self._cfg.enabled or step == self._last_saved:
            return False
        if step % self._cfg.every_steps and not final:
            return False
        self.save(step)
        return True

    def save(self, step: int) -> None:
        self.wait()
        try:
            self._save(step)
        except (OSError, RuntimeError, CheckpointException) as exc:
            raise _save_error(exc, step=step, root=self._root, rank=self._rank,
                              store_uri=self._store_uri) from None

    def _save(self, step: int) -> None:
        path = _step_dir(self._root, step)
        state = self._on_disk(self._state())
        # Taken with the state: the RNG as the next step will find it.
        rng_file = _rng_file(path, self._rank)
        rng_file.parent.mkdir(parents=True, exist_ok=True)
        torch.save(_rng_state(), rng_file)
        if self._hook is not None:
            hook_file = _hook_file(path, self._rank)
            hook_file.parent.mkdir(parents=True, exist_ok=True)
            torch.save(self._hook.state_dict(), hook_file)
        if self._zero1:
            self._opt.consolidate_state_dict(to=0)
            if self._rank == 0:
                path.mkdir(parents=True, exist_ok=True)
                torch.save(self._opt.state_dict(), path / ZERO1_FILE)
        if self._async:
            fut = dcp.async_save(state, checkpoint_id=str(path), process_group=self._pg)
            self._pending = (step, fut)
        else:
            dcp.save(state, checkpoint_id=str(path))
            self._finish(step)
        self._last_saved = step

    def wait(self) -> None:
        """Blocks until the pending async save is on disk, then marks it complete."""
        if self._pending is None:
            return
        step, fut = self._pending
        self._pending = None
        try:
            fut.result()
            self._finish(step)
        except (OSError, RuntimeError, CheckpointException) as exc:
            raise _save_error(exc, step=step, root=self._root, rank=self._rank,
                              store_uri=self._store_uri) from None

    def _finish(self, step: int) -> None:
        # Every rank's files must be written before the marker says "complete".
        _barrier()
        if self._rank == 0:
            path = _step_dir(self._root, step)
            partial = path / f".{MARKER}.tmp"
            partial.write_text(json.dumps({"step": step}))
            os.replace(partial, path / MARKER)  # whole or absent, also on a full disk
            self._prune()
            if self._on_saved is not None:
                self._on_saved({"step": step, "path": os.fspath(path),
                                "size_bytes": _size_bytes(path), "time": time.time(),
                                "kept": complete_steps(self._root)})

    def _prune(self) -> None:
        for old in complete_steps(self._root)[:-self._cfg.keep]:
            shutil.rmtree(_step_dir(self._root, old), ignore_errors=True)

    # -- load -------------------------------------------------------------------------------
    def load_latest(self) -> int:
        """Loads the newest complete checkpoint; returns its step (0 when there is none)."""
        steps = complete_steps(self._root)
        if not steps:
            return 0
        step = steps[-1]
        path = _step_dir(self._root, step)
        state = self._state()
        zero1_state = None
        if self._zero1 or (path / ZERO1_FILE).is_file():
            # Model only: the optimizer state is either ZeRO-1's file or absent in DCP.
            state = {"model": state["model"]}
            if self._zero1 and (path / ZERO1_FILE).is_file():
                zero1_state = torch.load(path / ZERO1_FILE, weights_only=False)
        disk = self._on_disk(state)
        dcp.load(disk, checkpoint_id=str(path))
        for key, part in state.items():
            self._experts.load_into(disk[key], part)
        model = self._model
        if "optim" in state:
            set_state_dict(model, self._opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"], options=_OPTIM_OPTIONS)
        else:
            set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={},
                           options=StateDictOptions(strict=True))
        if zero1_state is not None:
            self._opt.load_state_dict(zero1_state)
        rng_file = _rng_file(path, self._rank)
        self.rng_restored = rng_file.is_file()
        if self.rng_restored:
            _set_rng_state(torch.load(rng_file, weights_only=True))
        hook_file = _hook_file(path, self._rank)
        if self._hook is not None and hook_file.is_file():
            # PowerSGD's state holds a numpy RandomState: a full unpickle of our own file.
            self.hook_restored = self._hook.load_state_dict(
                torch.load(hook_file, weights_only=False))
        self._last_saved = step
        return step
