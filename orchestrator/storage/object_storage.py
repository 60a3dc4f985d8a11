"""Checkpoints on object storage: a bucket spoken to over the S3 protocol, through `pyarrow.fs`.

With the cluster's checkpoint URI (`MESHYARD_CHECKPOINT_URI=s3://bucket/prefix`, the server
given its endpoint and keys) a job's checkpoints live at `<bucket>/<prefix>/<job id>/
step_<08d>/`, where every host reaches them. A job's ranks never see the store or its keys:
they write and read checkpoints on their host's disk under their run dir, as without it, and
trusted processes move the files (workers/host/checkpoint_transfer.py on the hosts,
runtime/checkpoint_uploads.py in the attempt's controller):

* once a checkpoint is complete on the hosts (the built-in loop's rank 0 marked it; every
  rank of a user script reported it), each host the job runs on uploads the files its disk
  holds, and the controller writes the step's `COMPLETE` marker in the store only after every
  host's upload ended well. A step without a marker in the store is never resumed from.
* before an attempt's ranks start, each host empties the job's local checkpoint folder and
  downloads the store's newest complete checkpoint into it, marker last.

The keys stay with the control plane and its Ray actors (the attempt's config, the calls to
the worker actors); a job's spec cannot name a bucket, since the service's keys would then
write wherever a job asks.

>>> s = ObjectStorage.parse("s3://ckpt/team-a/", endpoint="http://198.18.0.1:9000")
>>> s.uri, s.step_uri("j1", 40)
('s3://ckpt/team-a', 's3://ckpt/team-a/j1/step_00000040')
>>> try:
...     ObjectStorage.parse("gs://x", endpoint=None)
... except StorageError as exc:
...     print(str(exc)[:58])
MESHYARD_CHECKPOINT_URI 'gs://x': give s3://BUCKET[/PREFIX
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from meshyard._protocol import MARKER, step_dir_name

MAX_FILES = 100_000  # files in one checkpoint moved to or from the store
CHUNK = 8 << 20
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_SEGMENT = re.compile(r"^[A-Za-z0-9._\-]+$")
_STEP = re.compile(r"^step_(\d{8})$")


class StorageError(RuntimeError):
    """The store cannot be used as configured or did not answer; the message says what to do."""


@dataclass(frozen=True)
class ObjectStorage:
    """Where checkpoints go on an S3-compatible store, with the keys to reach it (kept out of
    repr: this object is logged and passed between the control plane's processes)."""

    bucket: str
    prefix: str = ""  # "a/b", no slash at either end; "" for the bucket's root
    endpoint: str | None = None  # "http://host:port"; None: AWS's own for the region
    region: str = "us-east-1"
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, uri: str, *, endpoint: str | None, region: str = "us-east-1",
              access_key: str | None = None, secret_key: str | None = None) -> ObjectStorage:
        parts = urlsplit(uri.strip())
        shown = f"MESHYARD_CHECKPOINT_URI {uri!r}"
        if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
            raise StorageError(f"{shown}: give s3://BUCKET[/PREFIX] (an S3-compatible store; a "
                               "directory every host mounts goes to MESHYARD_CHECKPOINT_STORAGE)")
        if not _BUCKET.match(parts.netloc):
            raise StorageError(f"{shown}: {parts.netloc!r} is not a bucket name (3-63 of a-z, "
                               "0-9, '.', '-')")
        segments = [s for s in parts.path.split("/") if s]
        bad = [s for s in segments if not _SEGMENT.match(s) or s in (".", "..")]
        if bad:
            raise StorageError(f"{shown}: the prefix part {bad[0]!r} is not allowed (letters, "
                               "digits, '.', '_', '-')")
        if endpoint:
            ep = urlsplit(endpoint)
            if ep.scheme not in ("http", "https") or not ep.hostname or ep.path.strip("/"):
                raise StorageError(f"MESHYARD_S3_ENDPOINT {endpoint!r}: give http(s)://HOST[:PORT]")
        return cls(bucket=parts.netloc, prefix="/".join(segments), endpoint=endpoint or None,
                   region=region, access_key=access_key, secret_key=secret_key)

    # -- names ------------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def job_path(self, job_id: str) -> str:
        """The job's folder as pyarrow names it (`bucket/prefix/job`)."""
        if not _SEGMENT.match(job_id) or job_id in (".", ".."):
            raise ValueError(f"not a job id: {job_id!r}")
        return "/".join(p for p in (self.bucket, self.prefix, job_id) if p)

    def step_path(self, job_id: str, step: int) -> str:
        return f"{self.job_path(job_id)}/{step_dir_name(step)}"

    def step_uri(self, job_id: str, step: int) -> str:
        return f"s3://{self.step_path(job_id, step)}"

    # -- the store ----------------------------------------------------------------------------
    def filesystem(self) -> Any:
        from pyarrow import fs as pafs

        kw: dict[str, Any] = {"region": self.region, "connect_timeout": 5,
                              "request_timeout": 30, "retry_strategy":
                              pafs.AwsStandardS3RetryStrategy(max_attempts=3)}
        if self.endpoint:
            ep = urlsplit(self.endpoint)
            kw.update(endpoint_override=ep.netloc, scheme=ep.scheme)
        if self.access_key and self.secret_key:  # else AWS's chain (an instance's role)
            kw.update(access_key=self.access_key, secret_key=self.secret_key)
        return pafs.S3FileSystem(**kw)

    def check(self) -> None:
        """StorageError naming the setting unless the bucket answers."""
        from pyarrow import fs as pafs

        try:
            info = self.filesystem().get_file_info(self.bucket)
        except OSError as exc:
            raise StorageError(self._unreachable(exc)) from None
        if info.type is not pafs.FileType.Directory:
            raise StorageError(f"the checkpoint bucket {self.bucket!r} does not exist at "
                               f"{self.endpoint or 'AWS'}: create it, or change "
                               "MESHYARD_CHECKPOINT_URI")

    def _unreachable(self, exc: BaseException) -> str:
        return (f"the checkpoint store {self.uri} ({self.endpoint or 'AWS'}) did not answer: "
                f"{str(exc).strip().splitlines()[0][:300]}; check MESHYARD_S3_ENDPOINT and "
                "the keys (MESHYARD_S3_ACCESS_KEY / MESHYARD_S3_SECRET_KEY)")

    def complete_steps(self, job_id: str, *, fs: Any = None) -> list[int]:
        """The job's steps whose marker is in the store, ascending."""
        from pyarrow import fs as pafs

        fs = fs or self.filesystem()
        try:
            listed = fs.get_file_info(pafs.FileSelector(self.job_path(job_id),
                                                        allow_not_found=True))
            steps = sorted(int(m.group(1)) for i in listed
                           if i.type is pafs.FileType.Directory
                           and (m := _STEP.match(i.base_name)))
            if not steps:
                return []
            markers = fs.get_file_info([f"{self.step_path(job_id, s)}/{MARKER}" for s in steps])
        except OSError as exc:
            raise StorageError(self._unreachable(exc)) from None
        return [s for s, m in zip(steps, markers, strict=True) if m.type is pafs.FileType.File]

    def write_marker(self, job_id: str, step: int, info: dict[str, Any], *,
                     fs: Any = None) -> None:
        """The step's marker: one object, so it is in the store whole or not at all."""
        fs = fs or self.filesystem()
        with fs.open_output_stream(f"{self.step_path(job_id, step)}/{MARKER}") as f:
            f.write(json.dumps(info).encode())

    def step_files(self, job_id: str, step: int, *, fs: Any = None,
                   max_files: int = MAX_FILES) -> list[tuple[str, int]]:
        """(name below the step's folder with "/" separators, size) of each object in it, in
        name order; ValueError past `max_files`, or for a name that is not a plain relative
        one (objects written beside meshyard)."""
        from pyarrow import fs as pafs

        fs = fs or self.filesystem()
        base = self.step_path(job_id, step)
        out = []
        for i in fs.get_file_info(pafs.FileSelector(base, recursive=True)):
            if i.type is not pafs.FileType.File:
                continue
            rel = i.path[len(base) + 1:]
            parts = rel.split("/")
            if not i.path.startswith(base + "/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"the object {i.path!r} is not a file name meshyard writes")
            out.append((rel, i.size))
            if len(out) > max_files:
                raise ValueError(f"more than {max_files} files")
        return sorted(out)

    def remove_steps(self, job_id: str, steps: list[int], *, fs: Any = None) -> None:
        """Each step's marker first (it stops counting as complete), then its files."""
        fs = fs or self.filesystem()
        for step in steps:
            path = self.step_path(job_id, step)
            with contextlib.suppress(OSError):
                fs.delete_file(f"{path}/{MARKER}")
            with contextlib.suppress(OSError):
                fs.delete_dir(path)

    def prune(self, job_id: str, keep: int, *, fs: Any = None) -> list[int]:
        """Removes all but the newest `keep` complete steps; returns the kept ones."""
        fs = fs or self.filesystem()
        steps = self.complete_steps(job_id, fs=fs)
        self.remove_steps(job_id, steps[:-keep] if keep > 0 else steps, fs=fs)
        return steps[-keep:] if keep > 0 else []

    def copy_step(self, src_job: str, step: int, dst_job: str, *, fs: Any = None) -> int:
        """Copies a complete step of `src_job` into `dst_job`'s folder in the store (a copy on
        the server), marker last; returns the files copied. StorageError when the source has
        no complete checkpoint of that step."""
        fs = fs or self.filesystem()
        if step not in self.complete_steps(src_job, fs=fs):
            raise StorageError(f"job {src_job} keeps no complete checkpoint of step {step} in "
                               f"{self.uri}")
        src, dst = self.step_path(src_job, step), self.step_path(dst_job, step)
        files = self.step_files(src_job, step, fs=fs)
        for rel, _ in sorted(files, key=lambda f: f[0] == MARKER):
            fs.copy_file(f"{src}/{rel}", f"{dst}/{rel}")
        return len(files)
