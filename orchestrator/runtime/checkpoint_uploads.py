"""The attempt controller's side of checkpoints on object storage (runtime/object_storage.py).

`restore` runs once before the ranks start: every host of the attempt (one worker actor per
address) empties the job's local checkpoint folder and downloads the store's newest complete
checkpoint. A store that does not answer is asked again for up to RESTORE_WAIT_S; one that
stays down fails the attempt as STORE_UNAVAILABLE, which is restarted like any infrastructure
failure (a host that cannot hold the files fails it as a setup error).

`CheckpointUploads` follows each checkpoint the hosts completed on their disks:
every host uploads its part (the call runs in the worker actor's storage thread, beside
training), and when every host's upload ended well the step's marker goes into the store and
the steps beyond `checkpoint.keep` leave it; only then is the checkpoint reported (the
job's checkpoint list shows it with its `s3://` path). A host that fails its upload, dies, or
is cut off from the controller leaves the step without a marker, and the reason goes to the
job's log: a restart resumes from the newest step that is complete in the store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray

from orchestrator.runtime.events import AttemptConfig
from orchestrator.spec import SpecKind
from orchestrator.storage.object_storage import ObjectStorage, StorageError


def _cause(exc: BaseException) -> str:
    inner = getattr(exc, "cause", None)
    if isinstance(inner, BaseException):  # a RayTaskError: the actor's own exception
        exc = inner
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:500]


RESTORE_WAIT_S = 120.0  # how long a restarted attempt's hosts wait for a store that is down


def _store_failed(exc: BaseException) -> bool:
    """A host's download raised StoreTransferError (through Ray: as its cause)."""
    from workers.host.checkpoint_transfer import StoreTransferError

    return isinstance(exc, StoreTransferError) or \
        isinstance(getattr(exc, "cause", None), StoreTransferError)


def _restore_once(cfg: AttemptConfig, storage: ObjectStorage, hosts: Mapping[str, Any],
                  timeout_s: float) -> tuple[int | None, str | None, bool]:
    """(step, why not, whether the store's side failed: worth another try)."""
    try:
        steps = storage.complete_steps(cfg.job_id)
    except StorageError as exc:
        return None, f"the job's checkpoints could not be listed: {exc}", True
    step = steps[-1] if steps else None
    if not hosts:
        return step, None, False
    refs = {ip: w.restore_checkpoint.remote(storage, job_id=cfg.job_id, run_dir=cfg.run_dir,
                                            step=step) for ip, w in hosts.items()}
    done, late = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    for ip, ref in refs.items():
        if ref in late:
            return None, (f"{ip} did not download the checkpoint of step {step} from "
                          f"{storage.uri} within {timeout_s:g} s"), False
        try:
            ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - named in the attempt's failure
            return None, f"{ip}: {_cause(exc)}", _store_failed(exc)
    return step, None, False


def restore(cfg: AttemptConfig, storage: ObjectStorage, hosts: Mapping[str, Any], *,
            timeout_s: float = 600.0, wait_s: float = RESTORE_WAIT_S,
            on_wait: Callable[[str], None] | None = None) -> tuple[int | None, str | None, bool]:
    """(the step the hosts now hold, or None when the store has none; why not, or None;
    whether the store was what failed). A store that does not answer, or breaks off a
    download, is asked again (1, 2, 4 ... 15 s apart) for up to `wait_s`, and at least once
    (its client's own retries may take longer than the wait); `on_wait` hears the first
    miss. A host's own failure (its disk full, a link in its folder) ends at once."""
    deadline = time.monotonic() + wait_s
    delay, tries = 1.0, 0
    while True:
        step, error, store_side = _restore_once(cfg, storage, hosts, timeout_s)
        tries += 1
        if error is None or not store_side or \
                (tries > 1 and time.monotonic() + delay > deadline):
            if error is not None and store_side and tries > 1:
                error = f"{error} (asked {tries} times over {wait_s:g} s)"
            return step, error, store_side
        if tries == 1 and on_wait is not None:
            on_wait(f"the checkpoint store {storage.uri} failed the restore ({error}); asking "
                    f"again for up to {wait_s:g} s")
        time.sleep(delay)
        delay = min(delay * 2, 15.0)


@dataclass
class _Upload:
    step: int
    info: dict[str, Any]
    refs: dict[str, Any]  # host address -> its upload call
    sizes: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def open(self) -> list[str]:
        return [ip for ip in self.refs if ip not in self.sizes and ip not in self.failed]


class CheckpointUploads:
    def __init__(self, cfg: AttemptConfig, storage: ObjectStorage) -> None:
        self._cfg, self._storage = cfg, storage
        # The built-in loop keeps `checkpoint.keep`; user code keeps every reported one (0).
        self._keep = 0 if cfg.spec.kind is SpecKind.USER_CODE else cfg.spec.checkpoint.keep
        self._pending: dict[int, _Upload] = {}

    @property
    def pending(self) -> list[int]:
        return sorted(self._pending)

    def start(self, step: int, info: Mapping[str, Any], hosts: Mapping[str, Any]) -> None:
        """Every host in `hosts` (address -> a worker actor there) uploads its part of
        `step`; `info` is the checkpoint as the job's list records it."""
        if step in self._pending or not hosts:
            return
        refs = {ip: w.upload_checkpoint.remote(self._storage, job_id=self._cfg.job_id,
                                               run_dir=self._cfg.run_dir, step=step,
                                               keep=self._keep) for ip, w in hosts.items()}
        self._pending[step] = _Upload(step=step, info=dict(info), refs=refs)

    def poll(self, *, cut_off: Callable[[], set[str]] = set) -> tuple[list[dict[str, Any]],
                                                                    list[str]]:
        """(the checkpoints complete in the store now, as the job's list records them; a
        message for each step that will not be)."""
        saved: list[dict[str, Any]] = []
        messages: list[str] = []
        gone = cut_off()
        for step in sorted(self._pending):
            up = self._pending[step]
            waiting = {up.refs[ip]: ip for ip in up.open()}
            if waiting:
                ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
                for ref in ready:
                    ip = waiting[ref]
                    try:
                        up.sizes[ip] = int(ray.get(ref)["bytes"])
                    except Exception as exc:  # noqa: BLE001 - the step's message names it
                        up.failed[ip] = _cause(exc)
            for ip in up.open():
                if ip in gone:
                    up.failed[ip] = f"{ip} was cut off from the controller before its part " \
                                    "was uploaded"
            if up.open():
                continue
            del self._pending[step]
            if up.failed:
                messages.append(self._not_saved(step, "; ".join(up.failed.values())))
                continue
            try:
                fs = self._storage.filesystem()
                self._storage.write_marker(self._cfg.job_id, step, {
                    "step": step, "attempt": self._cfg.attempt, "hosts": sorted(up.sizes)},
                    fs=fs)
                kept = (self._storage.prune(self._cfg.job_id, self._keep, fs=fs) if self._keep
                        else self._storage.complete_steps(self._cfg.job_id, fs=fs))
            except (OSError, StorageError) as exc:
                messages.append(self._not_saved(step, _cause(exc)))
                continue
            saved.append({**up.info, "path": self._storage.step_uri(self._cfg.job_id, step),
                          "size_bytes": sum(up.sizes.values()), "time": time.time(),
                          "kept": kept})
        return saved, messages

    def finish(self, *, timeout_s: float, cut_off: Callable[[], set[str]] = set,
               tick_s: float = 0.2) -> tuple[list[dict[str, Any]], list[str]]:
        """Polls until no upload is open or `timeout_s` passed (what is still open then is
        given up, named in a message)."""
        saved: list[dict[str, Any]] = []
        messages: list[str] = []
        deadline = time.monotonic() + timeout_s
        while True:
            s, m = self.poll(cut_off=cut_off)
            saved += s
            messages += m
            if not self._pending or time.monotonic() >= deadline:
                break
            time.sleep(tick_s)
        for step in sorted(self._pending):
            late = ", ".join(self._pending[step].open())
            messages.append(self._not_saved(step, f"{late} did not finish uploading its part "
                                            f"within {timeout_s:g} s of the attempt's end"))
        self._pending.clear()
        return saved, messages

    def _not_saved(self, step: int, why: str) -> str:
        return (f"WARNING the checkpoint of step {step} is not in {self._storage.uri}: {why}; "
                "a restart resumes from the newest checkpoint complete there")
