"""Where a job's checkpoints may live, given where its ranks landed.

A restarted attempt resumes from the newest complete checkpoint, and may land on other hosts
than the one before: the checkpoints must be where every host reads them. With the cluster's
checkpoint storage (`Settings.checkpoint_storage`, a directory every host mounts) or its
object store (`Settings.checkpoint_uri`, orchestrator/storage/object_storage.py) they are.
Without it they go under each job's run dir, on the disk of the host each rank runs on: one
host holds a rank's part and another host the marker, and no host has the whole. So a job of
the built-in loop that keeps checkpoints and whose ranks landed on more than one host does not
start, and the message names the setting; user code, which may keep no checkpoint at all,
starts, and the first report with a checkpoint raises the message in the rank (Ray Train
refuses a multi-node run's checkpoint without shared storage the same way). Hosts are told
apart by address: the simulated nodes of one machine share one.

>>> host_local_checkpoints(enabled=True, shared=False, root="/r/j/checkpoints",
...                        ips={0: "10.0.0.1", 1: "10.0.0.2"})[:60]
'the ranks landed on 2 hosts (10.0.0.1, 10.0.0.2) and checkpo'
>>> host_local_checkpoints(enabled=True, shared=True, root="/ckpt/j",
...                        ips={0: "10.0.0.1", 1: "10.0.0.2"}) is None
True
"""

from __future__ import annotations

from collections.abc import Mapping


def host_local_checkpoints(*, enabled: bool, shared: bool, root: str,
                           ips: Mapping[int, str | None], user_code: bool = False) -> str | None:
    """Why the gang must not start (its checkpoints would be split over host-local disks),
    or None."""
    hosts = sorted({ip for ip in ips.values() if ip})
    if not enabled or shared or len(hosts) < 2:
        return None
    shown = ", ".join(hosts[:4]) + (f", and {len(hosts) - 4} more" if len(hosts) > 4 else "")
    return (f"the ranks landed on {len(hosts)} hosts ({shown}) and checkpoints would go to "
            f"{root} on each host's own disk, where a restart on other hosts cannot read them: "
            "give the cluster checkpoint storage that every host mounts at the same path "
            "(MESHYARD_CHECKPOINT_STORAGE, or `meshyard serve --checkpoint-storage DIR`) or "
            "an object store (MESHYARD_CHECKPOINT_URI=s3://BUCKET/PREFIX)"
            + (", or keep no checkpoint in this job" if user_code
               else ", or set checkpoint.enabled: false in the spec"))
