"""User code over the API (in-process app, real SQLite): code packages (upload, dedup, the
size cap, zips that must not reach a node), entrypoint specs (the conflict with the built-in
loop, a command that is not a list, a package never uploaded) and the deployment policy on
entrypoints (who may run code, which modules, which working-dir paths)."""

from __future__ import annotations

import io
import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.packaging import build_package
from api.server import prepare
from orchestrator.admission.access import Role
from orchestrator.settings import Settings

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "byo" / "ddp"


def _zip(entries: dict[str, bytes], *, symlink: str | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, "/etc/passwd")
    return buf.getvalue()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, dict[str, str]], Settings]]:
    settings = Settings(data_dir=tmp_path / "data", max_package_bytes=64 * 1024,
                        working_dir_roots=[str(tmp_path / "shared")])
    prepared = prepare(settings)
    tokens = {"admin": prepared.admin_token, "user": prepared.store.create_token("carol"),
              "viewer": prepared.store.create_token("vic")}
    prepared.store.set_role("vic", Role.VIEWER)
    with TestClient(create_app(settings, store=prepared.store),
                    base_url="http://127.0.0.1") as client:
        yield client, {k: {"Authorization": f"Bearer {t}"} for k, t in tokens.items()}, settings
    prepared.store.close()


def _upload(client: TestClient, headers: dict[str, str], data: bytes) -> Any:
    return client.post("/v1/packages", content=data,
                       headers={**headers, "Content-Type": "application/zip"})


def test_upload_is_content_addressed_and_deduplicated(app) -> None:
    client, h, settings = app
    local = build_package(EXAMPLE, max_bytes=settings.max_package_bytes)
    first = _upload(client, h["user"], local.data)
    assert first.status_code == 201, first.text
    body = first.json()
    assert body == {"package": f"package:sha256:{local.digest}", "sha256": local.digest,
                    "bytes": len(local.data), "created": True}
    assert (settings.packages_dir / f"{local.digest}.zip").read_bytes() == local.data
    again = _upload(client, h["user"], local.data)
    assert again.status_code == 200 and again.json()["created"] is False
    assert client.get(f"/v1/packages/{local.digest}", headers=h["user"]).status_code == 200
    assert client.get("/v1/packages/" + "0" * 64, headers=h["user"]).status_code == 404
    assert client.get("/v1/packages/../meshyard.db", headers=h["user"]).status_code in (404, 422)


@pytest.mark.parametrize("entries,symlink,needle", [
    ({"../evil.py": b"x"}, None, "plain relative path"),
    ({"/abs.py": b"x"}, None, "plain relative path"),
    ({"a.py": b"x"}, "link", "symlink"),
])
def test_zips_that_must_not_reach_a_node_are_refused(app, entries, symlink, needle) -> None:
    client, h, settings = app
    r = _upload(client, h["user"], _zip(entries, symlink=symlink))
    assert r.status_code == 422 and needle in r.text, r.text
    assert [p.name for p in settings.packages_dir.glob("*.zip")] == []  # nothing kept


def _flip_byte(data: bytes, name: str) -> bytes:
    """The member's stored data with one byte changed: its directory record stays valid."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        at = zf.getinfo(name).header_offset + 30 + len(name) + 100
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


def _deflate64(data: bytes) -> bytes:
    """Every entry marked Deflate64 (method 9), in its local header and directory record."""
    out = bytearray(data)
    for sig, field in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        at = out.find(sig)
        while at >= 0:
            out[at + field:at + field + 2] = (9).to_bytes(2, "little")
            at = out.find(sig, at + 4)
    return bytes(out)


@pytest.mark.parametrize(("damage", "needle"), [
    (lambda raw: _flip_byte(raw, "train.py"), "Bad CRC-32"),
    (_deflate64, "Deflate64"),
])
def test_a_damaged_or_foreign_zip_is_a_422_naming_the_entry(app, damage, needle) -> None:
    client, h, settings = app
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("train.py", os.urandom(1000))
    r = _upload(client, h["user"], damage(buf.getvalue()))
    assert r.status_code == 422, r.text
    [error] = r.json()["errors"]
    assert error["loc"] == "<body>/train.py" and needle in error["msg"], error
    assert list(settings.packages_dir.iterdir()) == []  # no package, no temp file


def test_packages_belong_to_their_uploaders(app) -> None:
    client, h, settings = app
    local = build_package(EXAMPLE, max_bytes=settings.max_package_bytes)
    ref = f"package:sha256:{local.digest}"
    spec = {"name": "byo", "parallelism": {"dp_replicate": 2},
            "entrypoint": {"command": ["python", "train.py"], "working_dir": ref}}
    other = build_package(EXAMPLE.parent / "raytrain", max_bytes=settings.max_package_bytes)
    assert _upload(client, h["user"], local.data).status_code == 201
    dave = {"Authorization": f"Bearer {client.app.state.meshyard.store.create_token('dave')}"}
    # Dave cannot tell carol's package from one never uploaded: not by GET ...
    mine, missing = (client.get(f"/v1/packages/{d}", headers=dave)
                     for d in (local.digest, other.digest))
    assert mine.status_code == missing.status_code == 404
    assert mine.json()["detail"].replace(local.digest, "D") == \
        missing.json()["detail"].replace(other.digest, "D")
    # ... nor by naming it in a spec ...
    as_dave = client.post("/v1/jobs", headers=dave, json=spec)
    never = client.post("/v1/jobs", headers=dave, json={
        **spec, "entrypoint": {**spec["entrypoint"], "working_dir": f"package:sha256:{other.digest}"}})
    assert as_dave.status_code == never.status_code == 422
    assert as_dave.json()["errors"][0]["msg"].replace(local.digest, "D") == \
        never.json()["errors"][0]["msg"].replace(other.digest, "D")
    # ... nor by uploading the same bytes: a first upload of his, as if new.
    fresh = _upload(client, dave, other.data)
    same = _upload(client, dave, local.data)
    assert (same.status_code, same.json()["created"]) == (fresh.status_code, True) == (201, True)
    assert same.headers["location"] == f"/v1/packages/{local.digest}"
    assert client.get(f"/v1/packages/{local.digest}", headers=dave).status_code == 200
    assert client.post("/v1/jobs", headers=dave, json=spec).status_code == 201
    # Admins may read and run any stored package.
    assert client.get(f"/v1/packages/{local.digest}", headers=h["admin"]).status_code == 200
    assert client.post("/v1/jobs", headers=h["admin"], json=spec).status_code == 201


def test_not_a_zip_oversize_and_wrong_roles_are_refused(app) -> None:
    client, h, settings = app
    r = _upload(client, h["user"], b"not a zip at all")
    assert r.status_code == 422 and "not a zip" in r.text
    big = _zip({"blob.bin": os.urandom(80 * 1024)})
    r = _upload(client, h["user"], big)
    assert r.status_code == 413 and "65536 bytes" in r.text, r.text
    chunks = (big[i:i + 8192] for i in range(0, len(big), 8192))  # no Content-Length
    r = client.post("/v1/packages", content=chunks,
                    headers={**h["user"], "Content-Type": "application/zip"})
    assert r.status_code == 413
    assert list(settings.packages_dir.glob("*")) in ([], [settings.packages_dir / "ray"])
    r = _upload(client, h["viewer"], _zip({"a.py": b"x"}))
    assert r.status_code == 403 and r.json()["policy"] == "roles"
    r = client.post("/v1/packages", content=b"{}", headers={**h["user"],
                                                             "Content-Type": "application/json"})
    assert r.status_code == 415


def test_entrypoint_specs_are_checked_before_anything_runs(app) -> None:
    client, h, settings = app
    ref = _upload(client, h["user"], build_package(EXAMPLE, max_bytes=10**6).data).json()
    ok = client.post("/v1/jobs", headers=h["user"], json={
        "name": "byo", "parallelism": {"dp_replicate": 2},
        "entrypoint": {"command": ["python", "train.py"], "working_dir": ref["package"],
                       "steps": 20}})
    assert ok.status_code == 201, ok.text
    job = ok.json()
    assert job["total_steps"] == 20 and job["world_size"] == 2
    assert {"model", "data", "training", "checkpoint"}.isdisjoint(job["spec"])
    cases = [
        ({"entrypoint": {"command": "python train.py"}}, "entrypoint.command", "not split"),
        ({"entrypoint": {"function": "train:main"}, "model": {"n_layers": 2}}, "model",
         "built-in training loop"),
        ({"entrypoint": {"function": "train:main", "command": ["x"]}}, "entrypoint",
         "exactly one"),
        ({"entrypoint": {"function": "train main"}}, "entrypoint.function", "pattern"),
        ({"entrypoint": {"command": ["python", "t.py"], "env": {"RANK": "3"}}},
         "entrypoint.env", "set by meshyard"),
        ({"entrypoint": {"command": ["python", "t.py"], "working_dir": "code/"}},
         "entrypoint", "--working-dir"),
        ({"entrypoint": {"command": ["python", "t.py"],
                         "working_dir": "package:sha256:" + "ab" * 32}},
         "entrypoint.working_dir", "not uploaded"),
        ({"entrypoint": {"command": ["python", "t.py"]}, "parallelism": "auto"},
         "parallelism.auto", "built-in loop"),
        ({"entrypoint": {"command": ["torchrun", "--nproc_per_node=2", "t.py"]}},
         "entrypoint.command", "meshyard is the launcher"),
    ]
    for extra, loc, needle in cases:
        r = client.post("/v1/jobs", headers=h["user"], json={"name": "bad", **extra})
        assert r.status_code == 422, (extra, r.text)
        errors = r.json()["errors"]
        assert any(e["loc"] == loc and needle in e["msg"] for e in errors), (extra, errors)


def test_the_policy_applies_to_entrypoints(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", code_roles=["admin"],
                        allowed_import_prefixes=["mylab"],
                        working_dir_roots=[str(tmp_path / "shared")])
    prepared = prepare(settings)
    user = {"Authorization": f"Bearer {prepared.store.create_token('carol')}"}
    admin = {"Authorization": f"Bearer {prepared.admin_token}"}
    with TestClient(create_app(settings, store=prepared.store),
                    base_url="http://127.0.0.1") as client:
        r = client.post("/v1/jobs", headers=user,
                        json={"name": "u", "entrypoint": {"function": "mylab.train:main"}})
        assert r.status_code == 403 and r.json()["policy"] == "code_roles"
        assert _upload(client, user, _zip({"a.py": b"x"})).status_code == 403
        for ep, loc in (({"function": "train:main"}, "entrypoint.function"),
                        ({"command": ["python", "t.py"]}, "entrypoint.command"),
                        ({"function": "mylab.train:main",
                          "working_dir": str(tmp_path / "elsewhere")}, "entrypoint.working_dir"),
                        ({"function": "mylab.train:main",
                          "working_dir": f"{tmp_path}/shared/../data"}, "entrypoint.working_dir")):
            r = client.post("/v1/jobs", headers=admin, json={"name": "a", "entrypoint": ep})
            assert r.status_code == 422, (ep, r.text)
            assert r.json()["errors"][0]["loc"] == loc
        r = client.post("/v1/jobs", headers=admin, json={"name": "a", "entrypoint": {
            "function": "mylab.train:main", "working_dir": str(tmp_path / "shared" / "code")}})
        assert r.status_code == 201, r.text
    prepared.store.close()
