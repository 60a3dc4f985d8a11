"""An upload is checked whole before it is kept: every member decompressed (in chunks) to its
declared size and CRC-32, stored or deflate only, size, ratio and overlap caps; a package
that is damaged on disk later fails with a PackageError and leaves no temp file."""

from __future__ import annotations

import io
import os
import struct
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from orchestrator.usercode.packages import (
    MAX_RATIO,
    PackageError,
    PackageWriter,
    check_zip,
    package_path,
    ray_package,
)

LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # zipfile's structFileHeader (30 bytes)


def _zip(entries: dict[str, bytes], *, method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _data_offset(raw: bytes, name: str) -> int:
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        offset = zf.getinfo(name).header_offset
    fields = LOCAL_HEADER.unpack_from(raw, offset)
    return offset + LOCAL_HEADER.size + fields[-2] + fields[-1]


def _flip_data_byte(raw: bytes, name: str) -> bytes:
    """The member's compressed data with one byte changed; the directory stays valid."""
    at = _data_offset(raw, name) + 100
    return raw[:at] + bytes([raw[at] ^ 0xFF]) + raw[at + 1:]


def _set_method(raw: bytes, method: int) -> bytes:
    """Every entry's compression method, in its local header and its directory record."""
    out = bytearray(raw)
    for sig, field in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        at = out.find(sig)
        while at >= 0:
            struct.pack_into("<H", out, at + field, method)
            at = out.find(sig, at + 4)
    return bytes(out)


def _set_flag(raw: bytes, bit: int) -> bytes:
    out = bytearray(raw)
    for sig, field in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = out.find(sig)
        while at >= 0:
            (flags,) = struct.unpack_from("<H", out, at + field)
            struct.pack_into("<H", out, at + field, flags | bit)
            at = out.find(sig, at + 4)
    return bytes(out)


def _check(tmp_path: Path, raw: bytes, *, max_unpacked: int = 10**8) -> tuple[int, int]:
    path = tmp_path / "up.zip"
    path.write_bytes(raw)
    return check_zip(path, max_unpacked_bytes=max_unpacked)


@pytest.mark.parametrize("method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_member_that_fails_its_crc_is_refused_naming_it(tmp_path: Path, method: int) -> None:
    raw = _zip({"ok.py": b"x = 1\n", "train.py": os.urandom(4096)}, method=method)
    assert _check(tmp_path, raw) == (2, 6 + 4096)
    bad = _flip_data_byte(raw, "train.py")
    with zipfile.ZipFile(io.BytesIO(bad)) as zf:
        assert zf.namelist() == ["ok.py", "train.py"]  # the directory reads fine
    with pytest.raises(PackageError, match=r"'train.py' is damaged \(Bad CRC-32") as err:
        _check(tmp_path, bad)
    assert err.value.entry == "train.py"


@pytest.mark.parametrize(("method", "label"), [(9, "Deflate64"), (zipfile.ZIP_BZIP2, "bzip2"),
                                               (zipfile.ZIP_LZMA, "LZMA"), (98, "method 98")])
def test_only_stored_and_deflate_entries_are_kept(tmp_path: Path, method: int,
                                                  label: str) -> None:
    if method in (zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA):
        raw = _zip({"a.py": b"print(1)\n" * 100}, method=method)  # a real bzip2 / LZMA entry
    else:
        raw = _set_method(_zip({"a.py": b"print(1)\n"}, method=zipfile.ZIP_STORED), method)
    with pytest.raises(PackageError, match=rf"'a.py' is compressed with {label}.*plain "
                                           "deflate") as err:
        _check(tmp_path, raw)
    assert err.value.entry == "a.py"


def test_encrypted_entries_are_refused(tmp_path: Path) -> None:
    raw = _set_flag(_zip({"secret.py": b"x"}, method=zipfile.ZIP_STORED), 0x01)
    with pytest.raises(PackageError, match="'secret.py' is encrypted; upload the code "
                                           "unencrypted"):
        _check(tmp_path, raw)


def test_ratio_total_and_overlap_caps(tmp_path: Path) -> None:
    zeros = _zip({"zeros.bin": b"\0" * (4 * 2**20)})
    with pytest.raises(PackageError, match=f"more than {MAX_RATIO}:1"):
        _check(tmp_path, zeros)
    _check(tmp_path, _zip({"small.txt": b"\0" * 2**20}))  # small members may compress well
    with pytest.raises(PackageError, match="unpack to more than 1000 bytes"):
        _check(tmp_path, _zip({"a": os.urandom(600), "b": os.urandom(600)}), max_unpacked=1000)
    # Two directory records that point at the same data: a zip bomb's way to multiply work.
    one = _zip({"a.py": os.urandom(5000)}, method=zipfile.ZIP_STORED)
    with zipfile.ZipFile(io.BytesIO(one)) as zf:
        start = zf.start_dir
    record = one[start:one.index(b"PK\x05\x06")]
    end = bytearray(one[one.index(b"PK\x05\x06"):])
    struct.pack_into("<HHL", end, 8, 2, 2, 2 * len(record))  # entries, entries, dir size
    twice = one[:start] + record + record.replace(b"a.py", b"b.py") + bytes(end)
    with pytest.raises(PackageError, match="overlap"):
        _check(tmp_path, twice)


def test_a_header_that_understates_its_member_is_refused(tmp_path: Path) -> None:
    raw = bytearray(_zip({"a.py": b"abcdef"}, method=zipfile.ZIP_STORED))
    cd = raw.find(b"PK\x01\x02")
    struct.pack_into("<L", raw, cd + 24, 7)  # file_size 6 -> 7 in the directory
    with pytest.raises(PackageError, match="'a.py'"):
        _check(tmp_path, bytes(raw))


def test_members_are_checked_in_chunks_not_held_whole(tmp_path: Path) -> None:
    big = _zip({"weights.bin": os.urandom(32 * 2**20)}, method=zipfile.ZIP_STORED)
    tracemalloc.start()
    try:
        _check(tmp_path, big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB"


def test_a_refused_upload_leaves_nothing_behind(tmp_path: Path) -> None:
    root = tmp_path / "store"
    w = PackageWriter(root, max_bytes=10**6, max_unpacked_bytes=10**7)
    w.write(_flip_data_byte(_zip({"t.py": os.urandom(2000)}), "t.py"))
    with pytest.raises(PackageError):
        w.finish()
    assert list(root.iterdir()) == []


def test_a_package_damaged_on_disk_fails_and_leaves_no_temp_file(tmp_path: Path) -> None:
    root = tmp_path / "store"
    w = PackageWriter(root, max_bytes=10**6, max_unpacked_bytes=10**7)
    w.write(_zip({"a.py": b"x = 1\n", "t.py": os.urandom(2000)}))
    digest = w.finish().digest
    stored = package_path(root, digest)
    stored.write_bytes(_flip_data_byte(stored.read_bytes(), "t.py"))  # bit rot, or an old one
    with pytest.raises(PackageError, match="'t.py' of stored package .* is damaged") as err:
        ray_package(root, digest)
    assert err.value.entry == "t.py"
    assert list((root / "ray").iterdir()) == []
    stored.write_bytes(b"not a zip")
    with pytest.raises(PackageError, match="not a readable zip"):
        ray_package(root, digest)
    assert list((root / "ray").iterdir()) == []
