"""Uploaded code packages: content-addressed zip files under `<data dir>/packages/`.

Pure module (stdlib only; it touches the control plane's own data dir, never a path a request
names). A package is the zip a user uploaded (`meshyard submit --working-dir DIR` builds it),
stored as `<sha256>.zip`; its id in a spec is `package:sha256:<sha256>`. Restarts and later
attempts find it there by id.

What reaches the nodes is a derived zip (`ray_package`): the same files under one top-level
folder, `meshyard-code/`. Ray's working_dir puts the unpacked root first on the worker
actor's PYTHONPATH; with the code one folder down (a name no `import` can reach), the user's
own top-level `api`, `workers` or `orchestrator` package can never shadow meshyard's modules
in the actor. The rank processes run inside `meshyard-code/`.

Checks on upload (`PackageWriter.finish`), so that a package that is kept can always be
unpacked: the size cap, a readable zip, at most `MAX_FILES` entries, relative names without
`..`, NUL or control characters, no symlinks, only stored or deflated entries (no Deflate64,
bzip2, LZMA or encryption, which a node may not unpack), at most `max_unpacked_bytes`
uncompressed, no member over 1 MiB compressed more than `MAX_RATIO`:1, compressed sizes that
fit in the archive (entries that share their data are a zip bomb), and every member
decompressed, streamed in chunks, to the size its header declares and its CRC-32. Work is
bounded: each compressed byte is read once and at most `max_unpacked_bytes` are inflated.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import struct
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

CODE_DIR = "meshyard-code"  # the folder the code sits in on every node (not importable)
MAX_FILES = 100_000
MAX_NAME_CHARS = 1024
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
_BAD_NAME = re.compile(r"[\x00-\x1f\x7f\\]")
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
MAX_RATIO = 200  # uncompressed : compressed, for members larger than RATIO_FREE_BYTES
RATIO_FREE_BYTES = 1024 * 1024
CHUNK = 64 * 1024  # members are decompressed this much at a time, never whole
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
_UNSUPPORTED = {9: "Deflate64", zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "LZMA"}
_ENCRYPTED = 0x01 | 0x40  # traditional and strong encryption (general purpose flag bits)
_PATCHED = 0x20
REZIP = ("re-zip it with plain deflate (`zip -r code.zip .`, or let `meshyard submit "
         "--working-dir DIR` build it)")
# What a broken member raises while it is read: a bad CRC or header (BadZipFile), a corrupt
# deflate stream (zlib.error), a truncated one (EOFError), and the like.
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError,
                NotImplementedError, RuntimeError, struct.error)


class PackageError(ValueError):
    """An upload that is not a usable package; the message names the problem and the fix.
    `entry`: the zip entry at fault, when one is."""

    def __init__(self, message: str, *, entry: str | None = None) -> None:
        super().__init__(message)
        self.entry = entry


class PackageTooLarge(PackageError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"package is larger than the limit of {limit} bytes; leave data, "
                         "checkpoints and environments out (.gitignore / .meshyardignore)")
        self.limit = limit


@dataclass(frozen=True)
class PackageInfo:
    digest: str  # sha256 of the uploaded zip
    size: int
    files: int
    unpacked_bytes: int
    created: bool  # False when the same package was already stored


def is_digest(text: str) -> bool:
    return bool(_DIGEST_RE.match(text))


def package_path(root: Path, digest: str) -> Path:
    if not is_digest(digest):
        raise PackageError(f"{digest!r} is not a sha256 hex digest")
    return root / f"{digest}.zip"


def package_exists(root: Path, digest: str) -> bool:
    return is_digest(digest) and package_path(root, digest).is_file()


def _check_name(name: str) -> None:
    parts = name.rstrip("/").split("/")
    if (not name or len(name) > MAX_NAME_CHARS or name.startswith("/") or _BAD_NAME.search(name)
            or any(p in ("", ".", "..") for p in parts)):
        raise PackageError(f"zip entry {name[:200]!r} is not a plain relative path (no leading "
                           "'/', '..', backslashes or control characters)")


def _check_entry(info: zipfile.ZipInfo) -> None:
    """What the central directory says of one entry: its name, type and method."""
    name = info.filename
    _check_name(name)
    if stat.S_ISLNK(info.external_attr >> 16):
        raise PackageError(f"zip entry {name!r} is a symlink; packages hold regular files "
                           "only", entry=name)
    if info.flag_bits & _ENCRYPTED:
        raise PackageError(f"zip entry {name!r} is encrypted; upload the code unencrypted: "
                           f"{REZIP}", entry=name)
    if info.flag_bits & _PATCHED or info.compress_type not in _METHODS:
        method = _UNSUPPORTED.get(info.compress_type, f"method {info.compress_type}")
        raise PackageError(f"zip entry {name!r} is compressed with {method}; packages hold "
                           f"stored or deflated entries only: {REZIP}", entry=name)


def _inflate(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> int:
    """Reads one member to its end in CHUNK pieces (zipfile checks its CRC-32 at the end);
    returns the bytes it unpacked to."""
    if info.file_size > RATIO_FREE_BYTES and \
            info.file_size > MAX_RATIO * max(info.compress_size, 1):
        raise PackageError(f"zip entry {info.filename!r} unpacks to {info.file_size} bytes "
                           f"from {info.compress_size}, more than {MAX_RATIO}:1; leave "
                           "generated or padded data out of the code package",
                           entry=info.filename)
    got = 0
    try:
        with zf.open(info) as data:
            while chunk := data.read(CHUNK):
                got += len(chunk)
    except _READ_ERRORS as exc:
        raise PackageError(f"zip entry {info.filename!r} is damaged ({exc}); build the zip "
                           f"again and upload it: {REZIP}", entry=info.filename) from None
    if got != info.file_size:
        raise PackageError(f"zip entry {info.filename!r} unpacks to {got} bytes, its header "
                           f"says {info.file_size}; build the zip again: {REZIP}",
                           entry=info.filename)
    return got


def check_zip(path: Path, *, max_unpacked_bytes: int) -> tuple[int, int]:
    """Checks the package whole (see the module docstring). Returns (files, bytes)."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise PackageError(f"not a zip file ({exc}); upload a .zip of the code directory") \
            from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_FILES:
            raise PackageError(f"{len(infos)} entries; a package holds at most {MAX_FILES}")
        total = compressed = 0
        for info in infos:
            _check_entry(info)
            total += info.file_size
            compressed += info.compress_size
        if total > max_unpacked_bytes:
            raise PackageError(f"the files unpack to more than {max_unpacked_bytes} bytes")
        if compressed > path.stat().st_size:
            raise PackageError("the entries' compressed sizes add up to more than the archive "
                               f"(entries that overlap are a zip bomb); {REZIP}")
        for info in infos:
            _inflate(zf, info)
    return sum(1 for i in infos if not i.is_dir()), total


class PackageWriter:
    """Receives an upload chunk by chunk (hashing it on the way) into the package store.

        w = PackageWriter(root, max_bytes=...); w.write(chunk) ...; info = w.finish()
    """

    def __init__(self, root: Path, *, max_bytes: int, max_unpacked_bytes: int) -> None:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._root, self._max, self._max_unpacked = root, max_bytes, max_unpacked_bytes
        fd, name = tempfile.mkstemp(dir=root, prefix=".upload-", suffix=".zip")
        self._tmp = Path(name)
        self._file = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self._size = 0

    def write(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self._max:
            self.abort()
            raise PackageTooLarge(self._max)
        self._hash.update(chunk)
        self._file.write(chunk)

    def finish(self) -> PackageInfo:
        self._file.close()
        try:
            files, unpacked = check_zip(self._tmp, max_unpacked_bytes=self._max_unpacked)
        except BaseException:
            self.abort()
            raise
        digest = self._hash.hexdigest()
        final = package_path(self._root, digest)
        created = not final.exists()
        if created:
            os.replace(self._tmp, final)
        else:
            self.abort()
        return PackageInfo(digest=digest, size=self._size, files=files,
                           unpacked_bytes=unpacked, created=created)

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink()


def ray_package(root: Path, digest: str) -> Path:
    """The zip that goes to the nodes: every entry of the package under `CODE_DIR/`, in name
    order with fixed timestamps (the same package always gives the same bytes). Built once,
    kept next to the package."""
    src = package_path(root, digest)
    out = root / "ray" / f"{digest}.zip"
    if out.is_file():
        return out
    if not src.is_file():
        raise PackageError(f"package sha256:{digest} is not in the package store (was it "
                           "deleted?); upload it again")
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, name = tempfile.mkstemp(dir=out.parent, suffix=".zip")
    os.close(fd)
    try:
        _write_node_zip(src, Path(name))
        os.replace(name, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    return out


def _write_node_zip(src: Path, dest: Path) -> None:
    try:
        zin = zipfile.ZipFile(src)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise PackageError(f"stored package {src.name} is not a readable zip ({exc}); "
                           "upload the code again") from None
    with zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        zout.writestr(zipfile.ZipInfo(f"{CODE_DIR}/", _FIXED_TIME), b"")
        for info in sorted(zin.infolist(), key=lambda i: i.filename):
            if info.is_dir():
                continue
            entry = zipfile.ZipInfo(f"{CODE_DIR}/{info.filename}", _FIXED_TIME)
            entry.external_attr = (info.external_attr >> 16 & 0o777 | 0o600) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.file_size = info.file_size  # zipfile picks ZIP64 from it; then the real size
            try:
                with zin.open(info) as data, zout.open(entry, "w") as target:
                    while chunk := data.read(CHUNK):
                        target.write(chunk)
            except _READ_ERRORS as exc:
                raise PackageError(f"zip entry {info.filename!r} of stored package "
                                   f"{src.name} is damaged ({exc}); upload the code again",
                                   entry=info.filename) from None
