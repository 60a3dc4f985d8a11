"""A host's side of checkpoints on object storage (orchestrator/runtime/object_storage.py).

The worker actor runs these for the attempt's controller, one host at a time per call; the
job's ranks take no part and never hold the store's keys. The job's checkpoints on this host
are `<runs>/<job id>/checkpoints/step_<08d>/`, a folder the job writes: every file is read
and written beneath the runs dir without following a link (a link or special file in a step
refuses its upload), so a job cannot make this process upload or overwrite anything of
another job or of the host.

* `upload_step`: the step's files on this host (not its marker: the controller writes the
  store's once every host's part is in), then the host's older local steps beyond `keep` go;
* `restore_step`: the job's local checkpoint folder emptied (another attempt's files, maybe
  of a step the store never completed), then the store's step downloaded into it, its
  marker last, so a half download never reads as a checkpoint.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from meshyard._protocol import MARKER, step_dir_name
from orchestrator.isolation import runfiles
from orchestrator.storage.object_storage import CHUNK, MAX_FILES, ObjectStorage, StorageError


class TransferError(RuntimeError):
    """A step was not moved; the message names the host, the step and the cause."""


class StoreTransferError(TransferError):
    """The store's side failed (it did not answer, refused, or broke off): worth asking again
    once it is back, unlike a failure of this host's disk."""


def _store_side(exc: BaseException) -> bool:
    """The store's client failed, not this host's files: pyarrow's S3 errors carry no errno
    (every local file error does)."""
    return isinstance(exc, StorageError) or (isinstance(exc, OSError) and exc.errno is None)


def _place(run_dir: str) -> tuple[Path, Path]:
    """(the runs dir, `<job id>/checkpoints` beneath it)."""
    run = Path(run_dir)
    return run.parent, Path(run.name) / "checkpoints"


def _fail(what: str, step: int, cause: BaseException | str) -> TransferError:
    text = cause if isinstance(cause, str) else (
        f"{type(cause).__name__}: {str(cause).strip().splitlines()[0][:300]}"
        if str(cause).strip() else type(cause).__name__)
    kind = StoreTransferError if isinstance(cause, BaseException) and _store_side(cause) \
        else TransferError
    return kind(f"{what} the checkpoint of step {step} on {socket.gethostname()}: {text}")


def _local_steps(anchor: Path, rel: Path) -> list[int]:
    out = []
    for name in runfiles.list_dir(anchor, rel):
        if name.startswith("step_") and name[5:].isdigit():
            out.append(int(name[5:]))
    return sorted(out)


def upload_step(storage: ObjectStorage, *, job_id: str, run_dir: str, step: int,
                keep: int) -> dict[str, Any]:
    """Uploads this host's files of `step` (then keeps its newest `keep` local steps, every
    one with 0); returns files, bytes, seconds and host."""
    t0 = time.monotonic()
    anchor, rel = _place(run_dir)
    step_rel = rel / step_dir_name(step)
    try:
        files = runfiles.walk_files(anchor, step_rel, max_files=MAX_FILES)
    except FileNotFoundError:
        raise _fail("could not upload", step, "its folder is gone from this host "
                    f"({anchor / step_rel})") from None
    except (OSError, ValueError) as exc:
        raise _fail("refused to upload", step, exc) from None
    files = [(n, s) for n, s in files if n != MARKER and not n.startswith(f".{MARKER}")]
    fs = storage.filesystem()
    base = storage.step_path(job_id, step)
    total = 0
    try:
        for name, _ in files:
            with os.fdopen(runfiles.open_read(anchor, step_rel / name), "rb") as src, \
                    fs.open_output_stream(f"{base}/{name}") as dst:
                while chunk := src.read(CHUNK):
                    dst.write(chunk)
                    total += len(chunk)
    except OSError as exc:
        raise _fail("could not upload", step, exc) from None
    # What this host keeps locally: the newest `keep` steps up to this one (the store holds
    # what a restart needs; a step being written now is newer and stays); 0: every one.
    local = [s for s in _local_steps(anchor, rel) if s <= step]
    for old in local[:-keep] if keep > 0 else []:
        runfiles.remove_tree(anchor, rel / step_dir_name(old))
    return {"files": len(files), "bytes": total, "host": socket.gethostname(),
            "seconds": round(time.monotonic() - t0, 3)}


def restore_step(storage: ObjectStorage, *, job_id: str, run_dir: str,
                 step: int | None) -> dict[str, Any]:
    """Empties the job's checkpoint folder on this host, then downloads `step` into it
    (nothing with None); returns files, bytes, seconds and host."""
    t0 = time.monotonic()
    anchor, rel = _place(run_dir)
    try:
        runfiles.remove_tree(anchor, rel)
    except OSError as exc:
        raise _fail("could not clear the folder for", step or 0, exc) from None
    if step is None:
        return {"files": 0, "bytes": 0, "host": socket.gethostname(), "seconds": 0.0}
    fs = storage.filesystem()
    base = storage.step_path(job_id, step)
    step_rel = rel / step_dir_name(step)
    total = 0
    try:
        anchor.mkdir(parents=True, exist_ok=True)  # a host this job (or any) never ran on
        files = storage.step_files(job_id, step, fs=fs)
        for name, _ in sorted(files, key=lambda f: f[0] == MARKER):  # the marker last
            with fs.open_input_stream(f"{base}/{name}") as src, \
                    os.fdopen(runfiles.open_write(anchor, step_rel / name), "wb") as dst:
                while chunk := src.read(CHUNK):
                    dst.write(chunk)
                    total += len(chunk)
    except (OSError, ValueError, StorageError) as exc:
        raise _fail("could not download", step, exc) from None
    return {"files": len(files), "bytes": total, "host": socket.gethostname(),
            "seconds": round(time.monotonic() - t0, 3)}
