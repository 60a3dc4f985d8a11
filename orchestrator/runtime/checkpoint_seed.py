"""A job that starts from another job's checkpoint (`checkpoint.resume_from`).

Before its first attempt starts workers, the attempt's controller copies the source job's
complete checkpoint folder `step_<08d step>/` (in its checkpoint folder: on the cluster's
checkpoint storage, else `<runs>/<source job>/checkpoints/`) into the job's own checkpoint
folder under the same name; the built-in loop and `meshyard.train.get_checkpoint()`
then resume from it as from one the job saved itself. The files are read beneath the
source job's checkpoint folder only, never through a link (a link or special file anywhere
refuses the copy, orchestrator/isolation/runfiles.py), and written to a hidden folder renamed
into place at the end, so a half copy is never taken for a checkpoint. The copy is in the kernel
(`copy_file_range`: a reflink where the filesystem offers one).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from meshyard._protocol import MARKER, step_dir_name
from orchestrator.isolation import runfiles
from orchestrator.spec import JobSpec

MAX_FILES = 100_000


class SeedError(Exception):
    """The checkpoint cannot be used; the message names it and what to do."""


Place = tuple[Path, Path]  # (a trusted folder, the checkpoint folder relative to it)


def seed_checkpoint(spec: JobSpec, *, into: Place, source: Place) -> int | None:
    """Places `spec.checkpoint.resume_from`'s checkpoint, a step folder in the source job's
    checkpoint folder `source`, in this job's, `into`, once: a complete copy already there is
    kept. Each place is read and written beneath its first part, never through a link in
    the second (which the jobs could have written). Returns the files copied, None when the
    spec names no checkpoint or it is already in place."""
    resume = spec.checkpoint.resume_from
    if resume is None:
        return None
    dst_root, dst_rel = into
    src_root, src_rel = source
    name = step_dir_name(resume.step)
    target = dst_rel / name
    os.makedirs(dst_root, mode=0o700, exist_ok=True)
    if runfiles.is_file(dst_root, target / MARKER):
        return None
    step_dir = src_rel / name
    if not runfiles.is_file(src_root, step_dir / MARKER):
        raise SeedError(f"checkpoint.resume_from: job {resume.job} no longer keeps a complete "
                        f"checkpoint of step {resume.step} (checkpoint.keep pruned it, or the "
                        f"job's files were removed); choose a kept one from GET /v1/jobs/"
                        f"{resume.job}/checkpoints")
    try:
        files = runfiles.walk_files(src_root, step_dir, max_files=MAX_FILES)
    except runfiles.UnsafePath as exc:
        raise SeedError(f"checkpoint.resume_from: job {resume.job}'s checkpoint of step "
                        f"{resume.step} is not copied: {exc}") from None
    except ValueError as exc:
        raise SeedError(f"checkpoint.resume_from: job {resume.job}'s checkpoint of step "
                        f"{resume.step} holds {exc}") from None
    partial = dst_rel / f".{name}.seeding"
    shutil.rmtree(dst_root / partial, ignore_errors=True)  # an earlier try's leftovers
    for rel, size in sorted(files, key=lambda f: f[0] == MARKER):  # the marker last
        src = runfiles.open_read(src_root, step_dir / rel)
        try:
            dst = runfiles.open_write(dst_root, partial / rel)
            try:
                left = size
                while left > 0:
                    n = os.copy_file_range(src, dst, left)
                    if n == 0:  # the source shrank while copied
                        raise SeedError(f"checkpoint.resume_from: {resume.job}'s file {rel} "
                                        "changed while it was copied; submit again")
                    left -= n
            finally:
                os.close(dst)
        finally:
            os.close(src)
    os.rename(dst_root / partial, dst_root / target)
    return len(files)
