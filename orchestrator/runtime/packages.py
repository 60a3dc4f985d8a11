"""Uploaded user code into Ray: the package's node zip (orchestrator/usercode/packages.py) stored in
Ray's GCS under a content-addressed `gcs://` URI, which worker actors name as their
runtime_env `working_dir`.

Why the control plane uploads: the actors are created by a detached controller actor, not by
a driver. Ray turns a *local* working_dir into a GCS package in the process that creates the
actor (`upload_working_dir_if_needed`, ray/_private/runtime_env/working_dir.py), and the
controller runs wherever Ray put it, without the data dir. A `gcs://` URI, by contrast, is
passed through untouched, and each node's runtime-env agent downloads and unpacks it
(`download_and_unpack_package`), keeping it while an actor that names it lives. So the
scheduler uploads the bytes here (Ray's own `upload_package_to_gcs`, as Ray's job submission
does), pins the URI until the gang can have started (GCS reference-counts a package by the
actors that use it and deletes it after the last; the pin covers the time before the first),
and every later attempt uploads again from the data dir if GCS has dropped it.
"""

from __future__ import annotations

from pathlib import Path

from ray._private.runtime_env.packaging import (
    package_exists,
    pin_runtime_env_uri,
    upload_package_to_gcs,
)

from orchestrator.usercode.packages import ray_package


def package_uri(digest: str) -> str:
    return f"gcs://_ray_pkg_meshyard_{digest}.zip"


def ensure_in_ray(packages_dir: Path, digest: str, *, pin_s: float) -> str:
    """The package's `gcs://` URI, uploading it when GCS does not hold it, pinned `pin_s`."""
    uri = package_uri(digest)
    if not package_exists(uri):
        upload_package_to_gcs(uri, ray_package(packages_dir, digest).read_bytes())
    pin_runtime_env_uri(uri, expiration_s=max(60, int(pin_s)))
    return uri
