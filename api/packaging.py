"""Client side of shipping code: a working directory -> one deterministic zip.

`meshyard submit SPEC --working-dir DIR` (and `MeshyardClient.upload_dir`) zip DIR with
`.gitignore`-style excludes — every `.gitignore` and `.meshyardignore` in the tree, each for
its own directory (pathspec's gitignore rules), plus `DEFAULT_EXCLUDES` — refuse a tree over
the size cap before zipping (naming its largest files), and write entries in name order with
fixed timestamps, so the same tree always gives the same bytes and the same package id.

>>> build_package(Path("examples/byo/ddp"), max_bytes=10**6).files   # doctest: +SKIP
('README.md', 'spec.yaml', 'train.py')
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pathspec

IGNORE_FILES = (".gitignore", ".meshyardignore")
DEFAULT_EXCLUDES = (".git/", "__pycache__/", "*.pyc", ".venv/", "venv/", ".meshyard/",
                    ".mypy_cache/", ".pytest_cache/", ".ruff_cache/", ".ipynb_checkpoints/")
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)


class PackageTooLargeLocal(ValueError):
    """The working dir holds more than the cap; the message lists its largest files."""


@dataclass(frozen=True)
class LocalPackage:
    data: bytes
    digest: str
    files: tuple[str, ...]
    unpacked_bytes: int


Specs = list[tuple[str, pathspec.PathSpec]]


def _specs_for(directory: Path, rel: str, inherited: Specs) -> Specs:
    out = list(inherited)
    for name in IGNORE_FILES:
        f = directory / name
        if f.is_file():
            lines = f.read_text(errors="replace").splitlines()
            out.append((rel, pathspec.GitIgnoreSpec.from_lines(lines)))
    return out


def _ignored(rel_path: str, specs: Specs, *, is_dir: bool) -> bool:
    for base, spec in specs:
        sub = rel_path[len(base) + 1:] if base else rel_path
        if spec.match_file(sub + "/" if is_dir else sub):
            return True
    return False


def collect_files(root: Path) -> list[tuple[str, Path]]:
    """(name in the zip, file) for every file of `root` the excludes keep, in name order.
    Symlinks are skipped (a package holds regular files)."""
    base: Specs = [("", pathspec.GitIgnoreSpec.from_lines(DEFAULT_EXCLUDES))]
    out: list[tuple[str, Path]] = []

    def walk(directory: Path, rel: str, specs: Specs) -> None:
        specs = _specs_for(directory, rel, specs)
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            path = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_symlink():
                continue
            if entry.is_dir():
                if not _ignored(path, specs, is_dir=True):
                    walk(Path(entry.path), path, specs)
            elif entry.is_file() and not _ignored(path, specs, is_dir=False):
                out.append((path, Path(entry.path)))

    walk(root, "", base)
    return sorted(out)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def build_package(root: Path, *, max_bytes: int) -> LocalPackage:
    """Zips `root` (see the module doc); PackageTooLargeLocal when it holds over `max_bytes`."""
    if not root.is_dir():
        raise FileNotFoundError(f"working dir {root} is not a directory")
    files = collect_files(root)
    sizes = [(p.stat().st_size, name) for name, p in files]
    total = sum(s for s, _ in sizes)
    if total > max_bytes:
        top = ", ".join(f"{n} ({_mib(s)})" for s, n in sorted(sizes, reverse=True)[:5])
        raise PackageTooLargeLocal(
            f"working dir {root} holds {_mib(total)} after excludes, over the {_mib(max_bytes)} "
            f"cap; largest: {top}. Add data, checkpoints and environments to .gitignore or "
            ".meshyardignore, or read them from a data root instead")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, path in files:
            info = zipfile.ZipInfo(name, _FIXED_TIME)
            mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.external_attr = mode << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    data = buf.getvalue()
    if len(data) > max_bytes:
        raise PackageTooLargeLocal(f"the zip of {root} is {_mib(len(data))}, over the "
                                   f"{_mib(max_bytes)} cap")
    return LocalPackage(data=data, digest=hashlib.sha256(data).hexdigest(),
                        files=tuple(n for n, _ in files), unpacked_bytes=total)
