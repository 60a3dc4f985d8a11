"""Helpers for the user-code tests: ship a fixture directory as a package, read rank files."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from api.packaging import build_package
from orchestrator.settings import Settings
from orchestrator.usercode.entrypoint import package_ref
from orchestrator.usercode.packages import PackageWriter

USER_CODE = Path(__file__).resolve().parents[2] / "fixtures" / "user_code"
EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "byo"
FT = {"max_failures": 0, "init_timeout_s": 60, "collective_timeout_s": 30}


def ship(settings: Settings, directory: Path) -> str:
    """Stores `directory` in the server's package store as an upload would; its spec ref."""
    local = build_package(directory, max_bytes=settings.max_package_bytes)
    writer = PackageWriter(settings.packages_dir, max_bytes=settings.max_package_bytes,
                           max_unpacked_bytes=8 * settings.max_package_bytes)
    writer.write(local.data)
    return package_ref(writer.finish().digest)


def ship_own(settings: Settings, directory: Path, *, scratch: Path, tag: str) -> str:
    """`ship` of a copy of `directory` tagged `tag`, so it is a package of its own. Jobs that
    run at once on the simulated cluster need this: its nodes share one disk, and two nodes'
    runtime-env agents unpacking the same package at once replace each other's directory
    under the actors already working in it (a real node has its own disk and one agent)."""
    import shutil

    copy = scratch / f"{directory.name}-{tag}"
    shutil.copytree(directory, copy)
    (copy / ".meshyard-test-tag").write_text(tag)
    return ship(settings, copy)


def user_spec(name: str, entrypoint: dict[str, Any], **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "parallelism": {"dp_replicate": 2},
                            "resources": {"cpus_per_worker": 0.25, "device": "cpu"},
                            "fault_tolerance": dict(FT), "entrypoint": entrypoint}
    spec.update(over)
    return spec


def wait_files(paths: list[Path], *, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"never written: {[p for p in paths if not p.exists()]}"
        time.sleep(0.2)


def rank_json(run_dir: Path, rank: int) -> dict[str, Any]:
    return dict(json.loads((run_dir / f"env-rank{rank}.json").read_text()))


def alive(pid: int) -> bool:
    """A live process (zombies count as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and os.path.exists(f"/proc/{pid}")
