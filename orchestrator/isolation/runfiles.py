"""Reading (and writing into) a job's run dir, where every byte may be the job's. Pure module.

A job's code writes its run dir: logs, reports, the probe's answers, checkpoints. Whoever
reads there for the control plane (the worker actor, the controller, the server) runs with
more rights than the job, so a name there must never lead it elsewhere:

* a path is walked one component at a time beneath the run dir with O_NOFOLLOW: a symbolic
  link anywhere below the root is refused (UnsafePath), not followed;
* only regular files are read, opened non-blocking (a FIFO can not hang the reader) and
  read up to a size limit;
* pickles are read with `plain_loads`, which builds only plain containers and scalars and
  refuses every class (a pickle can name any callable; unpickling one runs it).

    data = read_bytes(run_dir, "logs/attempt-1/rank-0.stderr", max_bytes=64 * 1024)
    info = read_json(run_dir, out / "probe.json", max_bytes=4 * 2**20)   # None if unusable

Writes go through `open_write`: the final name must not be a link (O_NOFOLLOW | O_CREAT),
and the directories on the way are walked (and made) the same way.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pickle
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_JSON_BYTES = 4 * 2**20


class UnsafePath(OSError):
    """A name beneath a run dir that is a link, not a regular file, or outside the dir."""


def _parts(root: Path, path: str | os.PathLike[str]) -> list[str]:
    """`path`'s components below `root` (`path` absolute, or relative to `root`)."""
    p = Path(path)
    if p.is_absolute():
        p = Path(os.path.normpath(p))
        for base in (Path(os.path.abspath(root)), Path(os.path.realpath(root))):
            if p.is_relative_to(base):
                p = p.relative_to(base)
                break
        else:
            raise UnsafePath(f"{path} is not inside {root}")
    parts = [x for x in p.parts if x not in ("", ".")]
    if ".." in parts:
        raise UnsafePath(f"{path}: '..' is not allowed")
    return parts


@contextlib.contextmanager
def _parent(root: str | os.PathLike[str], path: str | os.PathLike[str], *,
            make: bool = False) -> Iterator[tuple[int, str]]:
    """(a descriptor of the directory holding `path`'s last component, that component)."""
    root_p = Path(root)
    parts = _parts(root_p, path)
    if not parts:
        raise UnsafePath(f"{path} names the run dir itself, not a file in it")
    fd = os.open(root_p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not make:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
                nxt = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (20, 40):  # ENOTDIR, ELOOP: a file or a link
                    raise UnsafePath(f"{path}: {part!r} is not a directory") from None
                raise
            os.close(fd)
            fd = nxt
        yield fd, parts[-1]
    finally:
        os.close(fd)


def _open_regular(name: str, flags: int, *, dir_fd: int, shown: object) -> int:
    """`os.open` of `name` in `dir_fd` (created 0600 with O_CREAT), refusing a link (the
    flags carry O_NOFOLLOW) and anything but a regular file."""
    try:
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{shown} is a symbolic link") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(f"{shown} is not a regular file")
    return fd


def open_read(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of the regular file `path` beneath `root` (UnsafePath if any
    component is a link or the file is not a regular one)."""
    with _parent(root, path) as (dir_fd, name):
        return _open_regular(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=dir_fd, shown=path)


def read_bytes(root: str | os.PathLike[str], path: str | os.PathLike[str], *,
               max_bytes: int, offset: int = 0) -> bytes:
    """At most `max_bytes` of the file from `offset` (a negative offset: from the end)."""
    fd = open_read(root, path)
    with os.fdopen(fd, "rb") as f:
        if offset < 0:
            f.seek(max(0, os.fstat(fd).st_size + offset))
        elif offset:
            f.seek(offset)
        return f.read(max_bytes)


def tail(root: str | os.PathLike[str], path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    return read_bytes(root, path, max_bytes=max_bytes, offset=-max_bytes)


def size(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> int:
    fd = open_read(root, path)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_json(root: str | os.PathLike[str], path: str | os.PathLike[str], *,
              max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The file's JSON value; None when it is missing, unsafe, larger than `max_bytes`, or
    not JSON."""
    try:
        data = read_bytes(root, path, max_bytes=max_bytes + 1)
    except OSError:
        return None
    if len(data) > max_bytes:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def is_file(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    try:
        os.close(open_read(root, path))
    except OSError:
        return False
    return True


def list_dir(root: str | os.PathLike[str], path: str | os.PathLike[str] = ".") -> list[str]:
    """Names in a directory beneath `root` (no link followed on the way); [] if absent."""
    parts = _parts(Path(root), path)
    try:
        if not parts:
            return sorted(os.listdir(root))
        with _parent(root, path) as (dir_fd, name):
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=dir_fd)
            try:
                return sorted(os.listdir(fd))
            finally:
                os.close(fd)
    except OSError:
        return []


def walk_files(root: str | os.PathLike[str], path: str | os.PathLike[str], *,
               max_files: int) -> list[tuple[str, int]]:
    """Every regular file in the directory `path` beneath `root` and its subdirectories, as
    (name relative to `path` with "/" separators, size), in name order. A link, or anything
    but a directory or a regular file, anywhere in the tree is refused (UnsafePath), as is a
    tree of more than `max_files` files (ValueError)."""
    out: list[tuple[str, int]] = []

    def visit(fd: int, prefix: str) -> None:
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            name = prefix + e.name
            st = os.stat(e.name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise UnsafePath(f"{name} is a symbolic link")
            if stat.S_ISDIR(st.st_mode):
                sub = os.open(e.name, _DIR & ~os.O_PATH | os.O_RDONLY, dir_fd=fd)
                try:
                    visit(sub, name + "/")
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                out.append((name, st.st_size))
                if len(out) > max_files:
                    raise ValueError(f"more than {max_files} files")
            else:
                raise UnsafePath(f"{name} is not a regular file")

    with _parent(root, path) as (dir_fd, last):
        try:
            fd = os.open(last, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                raise UnsafePath(f"{path} is not a directory") from None
            raise
    try:
        visit(fd, "")
    finally:
        os.close(fd)
    return out


def remove_tree(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Removes `path` beneath `root`: a directory with all it holds, or a file or a link
    itself (never what a link points to); nothing when it is absent."""
    try:
        with _parent(root, path) as (dir_fd, name):
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return


def open_write(root: str | os.PathLike[str], path: str | os.PathLike[str], *,
               append: bool = False) -> int:
    """A write descriptor of `path` beneath `root`, created 0600 (directories on the way
    made 0700); never through a link."""
    with _parent(root, path, make=True) as (dir_fd, name):
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | \
            (os.O_APPEND if append else os.O_TRUNC)
        fd = _open_regular(name, flags, dir_fd=dir_fd, shown=path)
    os.set_blocking(fd, True)
    return fd


def write_text(root: str | os.PathLike[str], path: str | os.PathLike[str], text: str) -> None:
    with os.fdopen(open_write(root, path), "w", encoding="utf-8") as f:
        f.write(text)


def replace_text(root: str | os.PathLike[str], path: str | os.PathLike[str], text: str) -> None:
    """Writes `path` whole through a temporary file renamed over it (a reader never sees
    half of it); the rename replaces a link at `path`, never what it points to."""
    with _parent(root, path, make=True) as (dir_fd, name):
        tmp = f".{name}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dir_fd)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


class _Plain(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: only plain containers and "
                                     "scalars are read from a job's files")


def plain_loads(data: bytes) -> Any:
    """Unpickles dicts, lists, tuples, sets, strings, bytes, numbers, booleans and None, and
    refuses any class or function (pickle.UnpicklingError)."""
    return _Plain(io.BytesIO(data)).load()


def checkpoint_place(job_id: str, *, runs_dir: Path, storage: Path | None) -> tuple[Path, Path]:
    """A job's checkpoint folder as (a folder no job writes, the rest of the path): on the
    cluster's shared checkpoint storage `(<storage>, <job id>)`, else `(<runs dir>, <job
    id>/checkpoints)` (a disk of the host each rank runs on). Files in it are opened beneath
    the first part, never through a link in the second (the functions above)."""
    if storage is not None:
        return Path(storage).resolve(), Path(job_id)
    return Path(runs_dir), Path(job_id) / "checkpoints"


def checkpoint_root(job_id: str, *, runs_dir: Path, storage: Path | None) -> Path:
    anchor, rel = checkpoint_place(job_id, runs_dir=runs_dir, storage=storage)
    return anchor / rel
